package fleet

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// Report is the fleet's status at one moment.
type Report struct {
	// At is when it was read.
	At time.Time `json:"at"`
	// Components are the processes alive, by kind (liveness.Kinds' order), host and instance.
	Components []liveness.Record `json:"components"`
	// Count is how many of each kind are alive; every kind is present.
	Count map[string]int `json:"count"`
	// Live is the work in progress.
	Live Work `json:"live"`
	// Missing names the kinds a deployment cannot work without (a scheduler, a facade) of which
	// none is alive.
	Missing []string `json:"missing"`
	// Capacity sums the workers' capacity and what they have in flight, by tier (pod, vm).
	Capacity map[assignment.Backend]liveness.WorkerInfo `json:"capacity"`
	// Rejected counts records in the components bucket that were not heartbeats (ErrInvalid).
	Rejected int `json:"rejected,omitempty"`
	// Autoscale is the autoscaling decision per tier (Decisions), when the reader knows the
	// capacity of one worker.
	Autoscale map[assignment.Backend]Scale `json:"autoscale,omitempty"`
}

// Work counts the live assignments.
type Work struct {
	Total int `json:"total"`
	// ByPhase counts them by phase (claimed, dispatched, started, ...).
	ByPhase map[assignment.Phase]int `json:"by_phase"`
	// ByTier counts them by tier (pod, vm).
	ByTier map[assignment.Backend]int `json:"by_tier"`
	// ByTierPhase counts them by tier, then phase.
	ByTierPhase map[assignment.Backend]map[assignment.Phase]int `json:"by_tier_phase"`
	// ByForge counts them by the forge their job comes from (gitea, github); for GitHub they
	// are slots: an environment whose runner GitHub gives some job of its scale set.
	ByForge map[string]int `json:"by_forge"`
	// GitHubJobs counts the GitHub slots whose runner has taken a job (JobStarted, phase
	// running); the others wait for GitHub to give them one, or are ending.
	GitHubJobs int `json:"github_jobs"`
}

// Required are the kinds a deployment needs at least one of: without a scheduler no job is
// claimed, without a facade no environment can register.
var Required = []string{liveness.KindScheduler, liveness.KindFacade}

// ErrIncomplete: a kind in Required has no live process (Report.Err).
var ErrIncomplete = errors.New("fleet: incomplete")

// Build reports on the components alive and the live assignments among states, read at at.
func Build(components []liveness.Record, states []assignment.State, at time.Time) Report {
	r := Report{
		At: at, Components: slices.Clone(components), Count: map[string]int{}, Missing: []string{},
		Capacity: map[assignment.Backend]liveness.WorkerInfo{},
		Live: Work{ByPhase: map[assignment.Phase]int{}, ByTier: map[assignment.Backend]int{},
			ByTierPhase: map[assignment.Backend]map[assignment.Phase]int{}, ByForge: map[string]int{}},
	}
	if r.Components == nil {
		r.Components = []liveness.Record{}
	}
	slices.SortFunc(r.Components, func(a, b liveness.Record) int {
		return cmp.Or(cmp.Compare(kindOrder(a.Kind), kindOrder(b.Kind)), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Instance, b.Instance))
	})
	for _, k := range liveness.Kinds {
		r.Count[k] = 0
	}
	for _, c := range r.Components {
		r.Count[c.Kind]++
		if c.Worker != nil {
			tier := assignment.BackendPod
			if c.Kind == liveness.KindVMWorker {
				tier = assignment.BackendVM
			}
			sum := r.Capacity[tier]
			sum.Capacity += c.Worker.Capacity
			sum.InFlight += c.Worker.InFlight
			r.Capacity[tier] = sum
		}
	}
	for _, k := range Required {
		if r.Count[k] == 0 {
			r.Missing = append(r.Missing, k)
		}
	}
	for _, s := range states {
		if !s.Live() {
			continue
		}
		r.Live.Total++
		r.Live.ByPhase[s.Phase]++
		r.Live.ByTier[s.Backend]++
		if r.Live.ByTierPhase[s.Backend] == nil {
			r.Live.ByTierPhase[s.Backend] = map[assignment.Phase]int{}
		}
		r.Live.ByTierPhase[s.Backend][s.Phase]++
		r.Live.ByForge[s.Forge.String()]++
		if s.GitHub() && s.Phase == assignment.Running {
			r.Live.GitHubJobs++
		}
	}
	return r
}

func kindOrder(kind string) int {
	if i := slices.Index(liveness.Kinds, kind); i >= 0 {
		return i
	}
	return len(liveness.Kinds)
}

// Err is nil when every kind in Required has a live process, and otherwise an ErrIncomplete
// that names the kinds without one and what their absence means.
func (r Report) Err() error {
	if len(r.Missing) == 0 {
		return nil
	}
	var why []string
	for _, k := range r.Missing {
		switch k {
		case liveness.KindScheduler:
			why = append(why, "no scheduler is alive: no job is claimed")
		case liveness.KindFacade:
			why = append(why, "no facade is alive: no environment can register or report")
		default:
			why = append(why, "no "+k+" is alive")
		}
	}
	return fmt.Errorf("%w: %s", ErrIncomplete, strings.Join(why, "; "))
}
