package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// AutoscaleAnswer is the body of GET /v1/fleet/autoscale.
type AutoscaleAnswer struct {
	At time.Time `json:"at"`
	// Tiers holds the decision per tier ("pod", "vm"): desired_workers, the reason, and the
	// demand it was decided from. A KEDA metrics-api trigger reads tiers.pod.desired_workers.
	Tiers map[assignment.Backend]Scale `json:"tiers"`
	Error string                       `json:"error,omitempty"`
}

// AutoscaleHandler serves GET /v1/fleet/autoscale: the autoscaling decision of the fleet
// fleetOf reads, as JSON (AutoscaleAnswer): 200 with the decision, 503 when the fleet cannot
// be read (an autoscaler then keeps its size).
func AutoscaleHandler(fleetOf func(context.Context) (Report, error)) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		r, err := fleetOf(ctx)
		rw.Header().Set("Content-Type", "application/json")
		if err != nil {
			rw.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(rw).Encode(AutoscaleAnswer{At: time.Now().UTC(), Tiers: map[assignment.Backend]Scale{}, Error: err.Error()})
			return
		}
		tiers := r.Autoscale
		if tiers == nil {
			tiers = map[assignment.Backend]Scale{}
		}
		_ = json.NewEncoder(rw).Encode(AutoscaleAnswer{At: r.At, Tiers: tiers})
	})
}

// AutoscaleCollector exports the autoscaling decision as gauges (dynrunner_autoscale_*), read
// from the fleet at each scrape; a scrape when the fleet cannot be read has no sample.
type AutoscaleCollector struct {
	fleetOf                                             func(context.Context) (Report, error)
	desired, queued, inFlight, workers, slots, draining *prometheus.Desc
}

// NewAutoscaleCollector returns the collector of the decisions of the fleet fleetOf reads.
func NewAutoscaleCollector(fleetOf func(context.Context) (Report, error)) *AutoscaleCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("dynrunner_autoscale_"+name, help, []string{"backend"}, nil)
	}
	return &AutoscaleCollector{
		fleetOf:  fleetOf,
		desired:  d("desired_workers", "Workers the tier wants (not counting draining ones): its queued and in-flight work over one worker's capacity, 0 when idle. The same as GET /v1/fleet/autoscale."),
		queued:   d("queued", "Claimed assignments of the tier waiting for capacity, as the autoscaling decision saw them."),
		inFlight: d("in_flight", "Assignments of the tier holding capacity, as the autoscaling decision saw them."),
		workers:  d("workers", "Workers of the tier online and taking new environments (heartbeats in dynrunner_components)."),
		slots:    d("slots", "Capacity of the tier's workers online and not draining."),
		draining: d("draining_workers", "Workers of the tier online and draining (cordoned)."),
	}
}

// Describe is prometheus.Collector.Describe.
func (c *AutoscaleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.desired, c.queued, c.inFlight, c.workers, c.slots, c.draining} {
		ch <- d
	}
}

// Collect is prometheus.Collector.Collect.
func (c *AutoscaleCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.fleetOf(ctx)
	if err != nil {
		return // no sample rather than a wrong one
	}
	for tier, s := range r.Autoscale {
		for d, v := range map[*prometheus.Desc]int{c.desired: s.DesiredWorkers, c.queued: s.Queued, c.inFlight: s.InFlight,
			c.workers: s.Workers, c.slots: s.Slots, c.draining: s.Draining} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), string(tier))
		}
	}
}
