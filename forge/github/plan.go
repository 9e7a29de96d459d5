package github

import (
	"cmp"
	"slices"
	"time"
)

// Slot is one environment slot of a scale set, as a plan sees it: a JIT runner of the scale set
// and the one-shot environment it runs in.
type Slot struct {
	ID int64
	// Bound: a job started on the slot's runner (JobStarted named it). GitHub chose the job;
	// dynrunner only records which.
	Bound bool
	// Since is when the slot was created.
	Since time.Time
}

// Snapshot is what the session's holder knows when it plans one message.
type Snapshot struct {
	// Assigned is the message's statistics' TotalAssignedJobs: the jobs GitHub assigned to the
	// scale set and that have not finished, running ones included.
	Assigned int
	// Available are the runner request ids of the message's JobAvailable messages.
	Available []int64
	// Slots are the scale set's live slots (not ended).
	Slots []Slot
	// Capacity is how many live slots the tier may have (its share of the fleet).
	Capacity int
}

// Steps are what to do for one message, in order: acquire the available jobs (GitHub then
// assigns them to the scale set, which is what the statistics count), create slots, retire
// idle ones.
type Steps struct {
	Acquire []int64
	// Create is how many new slots to create.
	Create int
	// Retire are idle slots (no job bound) that no assigned job needs: their runner is removed
	// by id and their environment destroyed. The youngest go first: an older idle runner is
	// the likelier to be given a job next.
	Retire []int64
}

// Plan decides one message: the scale set should have one live slot per assigned job, never
// more than Capacity. It never retires a slot whose runner took a job.
func Plan(s Snapshot) Steps {
	steps := Steps{Acquire: slices.Clone(s.Available)}
	want := max(min(s.Assigned, s.Capacity), 0)
	live := len(s.Slots)
	if live < want {
		steps.Create = want - live
		return steps
	}
	var idle []Slot
	for _, sl := range s.Slots {
		if !sl.Bound {
			idle = append(idle, sl)
		}
	}
	slices.SortFunc(idle, func(a, b Slot) int {
		return cmp.Or(b.Since.Compare(a.Since), cmp.Compare(b.ID, a.ID))
	})
	for _, sl := range idle[:min(live-want, len(idle))] {
		steps.Retire = append(steps.Retire, sl.ID)
	}
	return steps
}
