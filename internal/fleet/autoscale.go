package fleet

import (
	"fmt"
	"strings"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// Demand is what one tier has and wants, the input of Decide.
type Demand struct {
	// Queued are the claims waiting for capacity (phase queued); InFlight the assignments
	// holding it (admitted, not ended or failed).
	Queued   int `json:"queued"`
	InFlight int `json:"in_flight"`
	// Workers and Slots are the workers online that take new environments, and their capacity
	// summed; Draining the workers online that are cordoned (they finish what they hold and
	// take nothing new), and DrainingInFlight what they still hold.
	Workers          int `json:"workers"`
	Slots            int `json:"slots"`
	Draining         int `json:"draining"`
	DrainingInFlight int `json:"draining_in_flight"`
	// PerWorker is the capacity one new worker brings (its POD_CONCURRENCY or VM_CONCURRENCY):
	// the largest of the workers online, else the configured one.
	PerWorker int `json:"per_worker"`
}

// Scale is the autoscaling decision for one tier: how many workers (not counting draining
// ones) the tier wants, and why, in words an operator reads.
type Scale struct {
	Demand
	DesiredWorkers int    `json:"desired_workers"`
	Reason         string `json:"reason"`
}

// Decide returns how many workers a tier wants for its demand: enough slots for every
// assignment in flight on a worker that is not draining and every queued one, rounded up to
// whole workers, and zero when there is no work at all (scale to zero). Work held by draining
// workers is theirs to finish: it neither needs nor counts towards a new slot. It is a pure
// function; every input is in JetStream (the live assignments and the workers' heartbeats).
func Decide(d Demand) Scale {
	per := max(d.PerWorker, 1)
	need := max(d.Queued+d.InFlight-d.DrainingInFlight, 0)
	s := Scale{Demand: d, DesiredWorkers: (need + per - 1) / per}
	draining := ""
	if d.Draining > 0 {
		draining = fmt.Sprintf(", %d draining with %d in flight", d.Draining, d.DrainingInFlight)
	}
	if d.Queued == 0 && d.InFlight == 0 {
		s.Reason = "idle: scale to zero"
		if d.Workers > 0 || d.Draining > 0 {
			s.Reason = fmt.Sprintf("idle, %d %s online%s: scale to zero", d.Workers, plural(d.Workers, "worker"), draining)
		}
		return s
	}
	have := fmt.Sprintf("%d queued, %d in flight, %d %s of %d slots online%s", d.Queued, d.InFlight, d.Workers, plural(d.Workers, "worker"), d.Slots, draining)
	switch diff := s.DesiredWorkers - d.Workers; {
	case diff > 0:
		s.Reason = fmt.Sprintf("%s: want %d more", have, diff)
	case diff < 0:
		s.Reason = fmt.Sprintf("%s: want %d fewer", have, -diff)
	default:
		s.Reason = have + ": enough"
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// Decisions decides every tier of the report: tiers whose workers are online, tiers with live
// work, and the tiers perWorker names (the configured capacity of one worker per tier, for a
// tier with no worker online: scale from zero).
func (r Report) Decisions(perWorker map[assignment.Backend]int) map[assignment.Backend]Scale {
	demand := map[assignment.Backend]*Demand{}
	of := func(b assignment.Backend) *Demand {
		if demand[b] == nil {
			demand[b] = &Demand{PerWorker: perWorker[b]}
		}
		return demand[b]
	}
	for b := range perWorker {
		of(b)
	}
	first := map[assignment.Backend]bool{}
	for _, c := range r.Components {
		if c.Worker == nil {
			continue
		}
		d := of(tierOf(c))
		if !first[tierOf(c)] { // the workers online tell their capacity better than the configuration
			first[tierOf(c)] = true
			d.PerWorker = 0
		}
		d.PerWorker = max(d.PerWorker, c.Worker.Capacity)
		if c.Worker.Draining {
			d.Draining++
			d.DrainingInFlight += c.Worker.InFlight
			continue
		}
		d.Workers++
		d.Slots += c.Worker.Capacity
	}
	for tier, phases := range r.Live.ByTierPhase {
		d := of(tier)
		for ph, n := range phases {
			switch {
			case ph == assignment.Queued:
				d.Queued += n
			case assignment.InFlightPhase(ph):
				d.InFlight += n
			}
		}
	}
	out := map[assignment.Backend]Scale{}
	for b, d := range demand {
		out[b] = Decide(*d)
	}
	return out
}

func tierOf(c liveness.Record) assignment.Backend {
	if c.Kind == liveness.KindVMWorker {
		return assignment.BackendVM
	}
	return assignment.BackendPod
}

// Summary is the decisions in one line per tier, for logs and `dynrunner status`.
func Summary(scales map[assignment.Backend]Scale) string {
	var b strings.Builder
	for _, tier := range []assignment.Backend{assignment.BackendPod, assignment.BackendVM} {
		if s, ok := scales[tier]; ok {
			fmt.Fprintf(&b, "%s: desired workers %d (%s)\n", tier, s.DesiredWorkers, s.Reason)
		}
	}
	return b.String()
}
