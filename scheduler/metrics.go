package scheduler

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the scheduler's Prometheus metrics.
type Metrics struct {
	Claimed     *prometheus.CounterVec
	Rejected    prometheus.Counter
	FetchErrors prometheus.Counter
	Live        prometheus.Gauge
	// LeaseHeld is 1 while this replica holds the reconcile lease (LeaseReconcile), else 0.
	LeaseHeld prometheus.Gauge
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
	}
	if reg != nil {
		reg.MustRegister(m.Claimed, m.Rejected, m.FetchErrors, m.Live, m.LeaseHeld)
	}
	return m
}
