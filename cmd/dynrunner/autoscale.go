package main

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/fleet"
)

// autoscaleAnswer is the body of GET /v1/fleet/autoscale.
type autoscaleAnswer struct {
	At time.Time `json:"at"`
	// Tiers holds the decision per tier ("pod", "vm"): desired_workers, the reason, and the
	// demand it was decided from. A KEDA metrics-api trigger reads tiers.pod.desired_workers.
	Tiers map[assignment.Backend]fleet.Scale `json:"tiers"`
	Error string                             `json:"error,omitempty"`
}

// autoscaleHandler serves the autoscaling decision of the fleet fleetOf reads, as JSON: 200
// with the decision, 503 when the fleet cannot be read (an autoscaler then keeps its size).
func autoscaleHandler(fleetOf func(context.Context) (fleet.Report, error)) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		r, err := fleetOf(ctx)
		rw.Header().Set("Content-Type", "application/json")
		if err != nil {
			rw.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(rw).Encode(autoscaleAnswer{At: time.Now().UTC(), Tiers: map[assignment.Backend]fleet.Scale{}, Error: err.Error()})
			return
		}
		tiers := r.Autoscale
		if tiers == nil {
			tiers = map[assignment.Backend]fleet.Scale{}
		}
		_ = json.NewEncoder(rw).Encode(autoscaleAnswer{At: r.At, Tiers: tiers})
	})
}

// autoscaleCollector exports the autoscaling decision as gauges, read from the fleet at each
// scrape.
type autoscaleCollector struct {
	fleetOf                                             func(context.Context) (fleet.Report, error)
	desired, queued, inFlight, workers, slots, draining *prometheus.Desc
}

func newAutoscaleCollector(fleetOf func(context.Context) (fleet.Report, error)) *autoscaleCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("dynrunner_autoscale_"+name, help, []string{"backend"}, nil)
	}
	return &autoscaleCollector{
		fleetOf:  fleetOf,
		desired:  d("desired_workers", "Workers the tier wants (not counting draining ones): its queued and in-flight work over one worker's capacity, 0 when idle. The same as GET /v1/fleet/autoscale."),
		queued:   d("queued", "Claimed assignments of the tier waiting for capacity, as the autoscaling decision saw them."),
		inFlight: d("in_flight", "Assignments of the tier holding capacity, as the autoscaling decision saw them."),
		workers:  d("workers", "Workers of the tier online and taking new environments (heartbeats in dynrunner_components)."),
		slots:    d("slots", "Capacity of the tier's workers online and not draining."),
		draining: d("draining_workers", "Workers of the tier online and draining (cordoned)."),
	}
}

func (c *autoscaleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.desired, c.queued, c.inFlight, c.workers, c.slots, c.draining} {
		ch <- d
	}
}

func (c *autoscaleCollector) Collect(ch chan<- prometheus.Metric) {
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
