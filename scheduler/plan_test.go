package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

func TestPlanReconcile(t *testing.T) {
	const (
		lease  = 30 * time.Minute
		pickup = 10 * time.Minute
		every  = time.Minute
	)
	claimedAt := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	started := claimedAt.Add(-time.Hour) // long past the restart grace unless a case says otherwise
	asg := func(phase assignment.Phase, at time.Time) assignment.State {
		st := assignment.State{Record: assignment.Record{Transition: phase, Phase: phase, Task: 9, Epoch: 4, Backend: assignment.BackendPod,
			At: at, ClaimedAt: claimedAt, PickupDeadline: claimedAt.Add(pickup), LeaseExpires: claimedAt.Add(lease)}, Seq: 12}
		if phase == assignment.Claimed {
			st.Record.Epoch, st.Seq = 0, 4
		}
		return st
	}
	failure := func(st assignment.State, now time.Time) reconcileAction {
		ev, due := assignment.Overdue(st, now)
		require.True(t, due, "%s at %s is not overdue", st.Phase, now)
		return reconcileAction{kind: reconcileFail, ev: ev}
	}
	closeIt := reconcileAction{kind: reconcileClose}
	redispatch := reconcileAction{kind: reconcileRedispatch}
	keepalive := reconcileAction{kind: reconcileKeepalive}

	afterPickup := claimedAt.Add(pickup + time.Second)
	afterLease := claimedAt.Add(lease + time.Second)
	soon := claimedAt.Add(2 * time.Second)
	later := claimedAt.Add(time.Minute)
	slot := func(phase assignment.Phase, at time.Time, runner int64) assignment.State {
		st := asg(phase, at)
		st.Task, st.Forge, st.ScaleSet, st.RunnerName, st.RunnerID = assignment.SlotBase+1, assignment.ForgeGitHub, 2, "dynrunner-pod-1", runner
		return st
	}
	reporting := func(until time.Time) assignment.State {
		st := asg(assignment.Failed, later)
		st.Transition, st.Reporter, st.ReportUntil = assignment.Reporting, "scheduler@other", until
		return st
	}

	tests := []struct {
		name      string
		st        assignment.State
		now       time.Time
		started   time.Time
		keptAlive time.Time
		want      []reconcileAction
	}{
		{name: "claimed just now, never kept alive: keepalive", st: asg(assignment.Claimed, claimedAt), now: soon,
			want: []reconcileAction{keepalive}},
		{name: "claimed just now, kept alive recently: nothing", st: asg(assignment.Claimed, claimedAt), now: soon, keptAlive: claimedAt,
			want: nil},
		{name: "claimed for the redispatch delay exactly: no redispatch", st: asg(assignment.Claimed, claimedAt), now: claimedAt.Add(redispatchAfter), keptAlive: claimedAt,
			want: nil},
		{name: "claimed for longer than the redispatch delay: redispatch", st: asg(assignment.Claimed, claimedAt), now: claimedAt.Add(redispatchAfter + time.Nanosecond), keptAlive: claimedAt,
			want: []reconcileAction{redispatch}},
		{name: "claimed a while ago, keepalive due: redispatch, then keepalive", st: asg(assignment.Claimed, claimedAt), now: later, keptAlive: later.Add(-every),
			want: []reconcileAction{redispatch, keepalive}},
		{name: "dispatched, keepalive due", st: asg(assignment.Dispatched, soon), now: later,
			want: []reconcileAction{keepalive}},
		{name: "started, keepalive not due", st: asg(assignment.Started, soon), now: later, keptAlive: later.Add(-every + time.Nanosecond),
			want: nil},
		{name: "registered, keepalive due", st: asg(assignment.Registered, soon), now: later, keptAlive: later.Add(-2 * every),
			want: []reconcileAction{keepalive}},
		{name: "running: the runner reports itself", st: asg(assignment.Running, soon), now: later,
			want: nil},
		{name: "failed: close", st: asg(assignment.Failed, later), now: later.Add(time.Second),
			want: []reconcileAction{closeIt}},
		{name: "failed, report claimed and the claim holds: nothing", st: reporting(later.Add(time.Minute)), now: later.Add(59 * time.Second),
			want: nil},
		{name: "failed, the report claim ran out: close (claim it again)", st: reporting(later.Add(time.Minute)), now: later.Add(time.Minute),
			want: []reconcileAction{closeIt}},
		{name: "failed after the lease: close, no second failure", st: asg(assignment.Failed, later), now: afterLease,
			want: []reconcileAction{closeIt}},
		{name: "pickup deadline passed: fail, then close", st: asg(assignment.Dispatched, soon), now: afterPickup,
			want: []reconcileAction{failure(asg(assignment.Dispatched, soon), afterPickup), closeIt}},
		{name: "lease expired while running: fail, then close", st: asg(assignment.Running, soon), now: afterLease,
			want: []reconcileAction{failure(asg(assignment.Running, soon), afterLease), closeIt}},
		{name: "pickup deadline passed within the restart grace: keepalive only", st: asg(assignment.Registered, soon), now: afterPickup,
			started: afterPickup.Add(-time.Second), want: []reconcileAction{keepalive}},
		{name: "claimed, deadline passed within the restart grace: redispatch, keepalive", st: asg(assignment.Claimed, claimedAt), now: afterPickup,
			started: afterPickup.Add(-time.Second), want: []reconcileAction{redispatch, keepalive}},
		{name: "lease expired after the restart grace: fail, then close", st: asg(assignment.Running, soon), now: afterLease,
			started: afterLease.Add(-assignment.RestartGrace(lease)), want: []reconcileAction{failure(asg(assignment.Running, soon), afterLease), closeIt}},

		// GitHub slots: never kept alive or reported through Gitea; dispatched once configured.
		{name: "slot claimed, its runner not configured yet: nothing", st: slot(assignment.Claimed, claimedAt, 0), now: later,
			want: nil},
		{name: "slot configured for longer than the redispatch delay: redispatch, no keepalive", st: slot(assignment.Claimed, claimedAt, 41), now: later,
			want: []reconcileAction{redispatch}},
		{name: "slot started: no keepalive", st: slot(assignment.Started, soon, 41), now: later,
			want: nil},
		{name: "slot got no job by its pickup deadline: fail, closed by the session's holder", st: slot(assignment.Started, soon, 41), now: afterPickup,
			want: []reconcileAction{failure(slot(assignment.Started, soon, 41), afterPickup)}},
		{name: "slot failed: not reported through Gitea", st: slot(assignment.Failed, later, 41), now: later.Add(time.Second),
			want: nil},
		{name: "slot's deadline within the restart grace: nothing", st: slot(assignment.Started, soon, 41), now: afterPickup,
			started: afterPickup.Add(-time.Second), want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := reconcileSnapshot{st: tt.st, now: tt.now, started: started, lease: lease, keptAlive: tt.keptAlive, every: every}
			if !tt.started.IsZero() {
				s.started = tt.started
			}
			assert.Equal(t, tt.want, planReconcile(s))
		})
	}
}
