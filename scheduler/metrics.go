package scheduler

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Metrics are the scheduler's Prometheus metrics.
type Metrics struct {
	Claimed     *prometheus.CounterVec
	Rejected    prometheus.Counter
	FetchErrors prometheus.Counter
	Live        prometheus.Gauge
	// LeaseHeld is 1 while this replica holds the reconcile lease (LeaseReconcile), else 0.
	LeaseHeld prometheus.Gauge
	// InFlight and Queued are the live assignments holding capacity and waiting for it, per
	// tier; QueuedByOwner the waiting ones per repository owner (MaxOwnerLabels owners, the
	// rest as OtherOwners).
	InFlight, Queued *prometheus.GaugeVec
	QueuedByOwner    *prometheus.GaugeVec
	// AdmissionWait is how long queued claims waited for capacity, per tier and owner label.
	AdmissionWait *prometheus.HistogramVec

	owners ownerLabels
}

// MaxOwnerLabels bounds the owner label values of the scheduler's metrics: the first owners
// seen get their own label, every later one counts under OtherOwners.
const MaxOwnerLabels = 50

// OtherOwners is the owner label of the owners past MaxOwnerLabels.
const OtherOwners = "_other"

// ownerLabels hands out at most MaxOwnerLabels owner label values.
type ownerLabels struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (o *ownerLabels) label(owner string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if owner == "" {
		owner = "_none"
	}
	if o.seen[owner] {
		return owner
	}
	if len(o.seen) >= MaxOwnerLabels {
		return OtherOwners
	}
	if o.seen == nil {
		o.seen = map[string]bool{}
	}
	o.seen[owner] = true
	return owner
}

// observeLoad sets the queue and in-flight gauges from a tally of the live assignments. Only the
// reconciler calls it.
func (m *Metrics) observeLoad(l load) {
	for _, b := range []assignment.Backend{assignment.BackendPod, assignment.BackendVM} {
		m.InFlight.WithLabelValues(string(b)).Set(float64(l.inFlight[b]))
		m.Queued.WithLabelValues(string(b)).Set(float64(l.queued[b]))
	}
	m.QueuedByOwner.Reset()
	byLabel := map[string]int{}
	for _, owners := range l.queuedOwner {
		for _, o := range slices.Sorted(maps.Keys(owners)) {
			byLabel[m.owners.label(o)] += owners[o]
		}
	}
	for label, n := range byLabel {
		m.QueuedByOwner.WithLabelValues(label).Set(float64(n))
	}
}

// observeAdmission records the wait of a queued claim admitted after waited.
func (m *Metrics) observeAdmission(st assignment.State, waited time.Duration) {
	m.AdmissionWait.WithLabelValues(string(st.Backend), m.owners.label(st.Owner())).Observe(waited.Seconds())
}

// NewMetrics creates the metrics and registers them with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Claimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_tasks_claimed_total", Help: "Forge tasks claimed, by backend.",
		}, []string{"backend"}),
		Rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dynrunner_tasks_rejected_total", Help: "Forge tasks failed upstream unclaimed: their runs-on selects no enabled backend, or their grant (GRANTS_FILE) does not cover it.",
		}),
		FetchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dynrunner_fetch_errors_total", Help: "Failed FetchTask calls to the forge.",
		}),
		Live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dynrunner_assignments_live", Help: "Assignments not yet ended.",
		}),
		LeaseHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dynrunner_scheduler_reconcile_lease_held",
			Help: "1 while this scheduler replica holds the reconcile lease (it reconciles, reports failures and keeps tasks alive), else 0.",
		}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynrunner_assignments_in_flight", Help: "Live assignments holding capacity of their tier (admitted, not yet ended or failed), by backend; set by the reconciling scheduler.",
		}, []string{"backend"}),
		Queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynrunner_assignments_queued", Help: "Claimed assignments waiting in the admission queue for capacity (MAX_QUEUED), by backend; set by the reconciling scheduler.",
		}, []string{"backend"}),
		QueuedByOwner: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynrunner_assignments_queued_by_owner", Help: "Claimed assignments waiting for capacity, by repository owner (the first 50 owners seen; later ones as _other).",
		}, []string{"owner"}),
		AdmissionWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynrunner_admission_wait_seconds", Help: "How long queued assignments waited for capacity before admission, by backend and repository owner (the first 50 owners seen; later ones as _other).",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}, []string{"backend", "owner"}),
	}
	if reg != nil {
		reg.MustRegister(m.Claimed, m.Rejected, m.FetchErrors, m.Live, m.LeaseHeld, m.InFlight, m.Queued, m.QueuedByOwner, m.AdmissionWait)
	}
	return m
}
