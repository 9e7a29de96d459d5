package podworker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Metrics are a worker's Prometheus metrics: what sizing a fleet needs to know about its
// environments. Labels are bounded: tier (pod, vm), backend (the backend's Name) and result.
type Metrics struct {
	// EnvStart is how long the backend took to start an environment.
	EnvStart *prometheus.HistogramVec
	// QueueToStart is from the claim of an assignment to its environment started: the wait a
	// job sees in dynrunner, admission queue included.
	QueueToStart *prometheus.HistogramVec
	// JobDuration is from the job's start (its runner fetched the task) to its end, by result:
	// success, failure, cancelled, skipped (the runner's), or failed (the environment was lost).
	JobDuration *prometheus.HistogramVec
	// Heartbeat is how long one heartbeat took: the worker's key and a renewal of the key of
	// every environment it watches. Past a third of the keys' TTL the next one is late, and
	// past the TTL other workers adopt environments this one still watches.
	Heartbeat *prometheus.HistogramVec
	// Watched is how many environments the worker watches (whose keys it renews).
	Watched *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not registered). A pod and
// a vm worker in one process share one Metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		EnvStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynrunner_environment_start_seconds", Help: "Time the backend took to start an environment, by tier and backend.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120},
		}, []string{"tier", "backend"}),
		QueueToStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynrunner_queue_to_start_seconds", Help: "Time from an assignment's claim to its environment started (the admission queue included), by tier and backend.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800},
		}, []string{"tier", "backend"}),
		JobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynrunner_job_duration_seconds", Help: "Time from a job's start (its runner fetched the task) to its end, by tier and result (the runner's, or failed when the environment was lost), observed by the worker that watched the environment.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200},
		}, []string{"tier", "result"}),
		Heartbeat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynrunner_worker_heartbeat_seconds", Help: "Time one heartbeat of a worker took: its own key and the renewal of the key of every environment it watches, by tier. Alert well before a third of the keys' TTL (10 s by default).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"tier"}),
		Watched: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynrunner_worker_environments_watched", Help: "Environments the worker watches (and whose keys its heartbeat renews), by tier.",
		}, []string{"tier"}),
	}
	if reg != nil {
		reg.MustRegister(m.EnvStart, m.QueueToStart, m.JobDuration, m.Heartbeat, m.Watched)
	}
	return m
}

// beat records a heartbeat of a worker of tier that took took and renewed watched keys.
func (m *Metrics) beat(tier assignment.Backend, took time.Duration, watched int) {
	if m == nil {
		return
	}
	m.Heartbeat.WithLabelValues(string(tier)).Observe(took.Seconds())
	m.Watched.WithLabelValues(string(tier)).Set(float64(watched))
}

// started records an environment of st started by backend after took.
func (m *Metrics) started(st assignment.State, backend string, took time.Duration, now time.Time) {
	if m == nil {
		return
	}
	m.EnvStart.WithLabelValues(string(st.Backend), backend).Observe(took.Seconds())
	m.QueueToStart.WithLabelValues(string(st.Backend), backend).Observe(now.Sub(st.ClaimedAt).Seconds())
}

// ended records the end of a job whose environment this worker watched.
func (m *Metrics) ended(st assignment.State) {
	if m == nil || st.RunningAt.IsZero() {
		return // the job never started
	}
	result := st.Result
	if st.Phase != assignment.Completed {
		result = "failed"
	}
	switch result {
	case "success", "failure", "cancelled", "skipped", "failed":
	default:
		result = "other" // bounded: a forged record cannot add label values
	}
	m.JobDuration.WithLabelValues(string(st.Backend), result).Observe(st.At.Sub(st.RunningAt).Seconds())
}
