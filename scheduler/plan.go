package scheduler

import (
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// redispatchAfter is how long an assignment may stay claimed (no worker recorded `dispatched`)
// before the reconciler publishes its dispatch again: the first publish may have been lost in a
// crash between the claim and the publish. Publishing again is harmless: the dispatch's message
// id names the task and epoch, so JetStream drops a duplicate within its window, and a worker
// acknowledges one that arrives after the assignment moved on without acting on it.
const redispatchAfter = 5 * time.Second

// reconcileSnapshot is what the reconciler knows about one live assignment when it decides.
type reconcileSnapshot struct {
	st  assignment.State
	now time.Time
	// started is when the scheduler started; lease the assignments' lease length
	// (Config.Lease). Deadlines wait assignment.RestartGrace after a start.
	started time.Time
	lease   time.Duration
	// keptAlive is when the task was last reported alive upstream (zero: never), every the
	// keepalive interval (Config.Keepalive).
	keptAlive time.Time
	every     time.Duration
}

// reconcileKind is one step of reconciling an assignment.
type reconcileKind int

const (
	// reconcileFail: a deadline passed; append ev, the failure.
	reconcileFail reconcileKind = iota + 1
	// reconcileClose: claim the failure report (`reporting`), report it upstream, then record
	// `closed`.
	reconcileClose
	// reconcileRedispatch: publish the dispatch again.
	reconcileRedispatch
	// reconcileKeepalive: tell the forge the task is alive while its environment starts, and
	// notice a cancellation made in the forge meanwhile.
	reconcileKeepalive
)

// reconcileAction is one step of planReconcile's answer.
type reconcileAction struct {
	kind reconcileKind
	// ev is the failure to append (fail); its Actor is the applier's.
	ev assignment.Event
}

// planReconcile decides what reconciling one live assignment takes. The steps are carried out
// in order; the first that fails, or finds the failure already recorded, ends the pass (the
// next pass starts again from what it finds).
func planReconcile(s reconcileSnapshot) []reconcileAction {
	// After a restart, environments get two renewal intervals to reach the facade again
	// before deadlines that passed while the controller was down are enforced.
	grace := s.now.Sub(s.started) < assignment.RestartGrace(s.lease)
	if s.st.GitHub() {
		return planSlot(s, grace)
	}
	if ev, due := assignment.Overdue(s.st, s.now); due && !grace {
		return []reconcileAction{{kind: reconcileFail, ev: ev}, {kind: reconcileClose}}
	}
	keepalive := s.now.Sub(s.keptAlive) >= s.every
	var plan []reconcileAction
	switch s.st.Phase {
	case assignment.Failed:
		// A report claimed by anyone, this scheduler too, is not claimed again until the claim
		// runs out: its holder reports, or failed to and retries after it.
		if s.st.Reporter == "" || !s.now.Before(s.st.ReportUntil) {
			plan = append(plan, reconcileAction{kind: reconcileClose})
		}
	case assignment.Claimed:
		// The dispatch may have been lost in a crash between the claim and its publish; the
		// publish is deduplicated by task and epoch.
		if s.now.Sub(s.st.At) > redispatchAfter {
			plan = append(plan, reconcileAction{kind: reconcileRedispatch})
		}
		if keepalive {
			plan = append(plan, reconcileAction{kind: reconcileKeepalive})
		}
	case assignment.Queued, assignment.Dispatched, assignment.Started, assignment.Registered:
		if keepalive {
			plan = append(plan, reconcileAction{kind: reconcileKeepalive})
		}
	}
	return plan
}

// planSlot decides a GitHub slot: its deadlines and its dispatch are the scheduler's as for any
// assignment, once its runner is configured. Gitea is never told of it, and its failure is
// reported to GitHub (its runner removed) by the holder of its scale set's session, not here.
func planSlot(s reconcileSnapshot, grace bool) []reconcileAction {
	if ev, due := assignment.Overdue(s.st, s.now); due && !grace {
		return []reconcileAction{{kind: reconcileFail, ev: ev}}
	}
	if s.st.Phase == assignment.Claimed && s.st.Ready() && s.now.Sub(s.st.At) > redispatchAfter {
		return []reconcileAction{{kind: reconcileRedispatch}}
	}
	return nil
}
