package facade

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the facade's Prometheus metrics.
type Metrics struct {
	Reports *prometheus.CounterVec
	Refused *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_facade_requests_total", Help: "Facade requests served, by method.",
		}, []string{"method"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_facade_refused_total", Help: "Facade requests refused, by reason.",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.Reports, m.Refused)
	}
	return m
}
