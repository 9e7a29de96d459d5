package scheduler

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the scheduler's Prometheus metrics.
type Metrics struct {
	Claimed     *prometheus.CounterVec
	Rejected    prometheus.Counter
	FetchErrors prometheus.Counter
	Live        prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Claimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_tasks_claimed_total", Help: "Forge tasks claimed, by backend.",
		}, []string{"backend"}),
		Rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dynrunner_tasks_rejected_total", Help: "Forge tasks failed upstream because their runs-on selects no enabled backend.",
		}),
		FetchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dynrunner_fetch_errors_total", Help: "Failed FetchTask calls to the forge.",
		}),
		Live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dynrunner_assignments_live", Help: "Assignments not yet ended.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Claimed, m.Rejected, m.FetchErrors, m.Live)
	}
	return m
}
