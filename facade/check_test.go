package facade

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// asg is an assignment of task 5 at epoch 3 in phase, on backend.
func asg(phase assignment.Phase, backend assignment.Backend) assignment.State {
	st := assignment.State{Record: assignment.Record{Transition: phase, Phase: phase, Task: 5, Epoch: 3, Backend: backend,
		RunnerUUID: "runner-a", LeaseExpires: time.Date(2026, 12, 3, 13, 0, 0, 0, time.UTC)}, Seq: 9}
	if phase == assignment.Claimed {
		st.Record.Epoch, st.Seq = 0, 3
	}
	return st
}

// checkVerdict asserts got is want: nil, or the same refusal reason (none: an answer that is no
// refusal) and code with an error.
func checkVerdict(t *testing.T, want, got *verdict) {
	t.Helper()
	if want == nil {
		assert.Nil(t, got)
		return
	}
	require.NotNil(t, got)
	assert.Equal(t, want.reason, got.reason, "reason")
	assert.Equal(t, want.code, got.code, "code")
	require.Error(t, got.err)
	if want.err != nil {
		assert.ErrorIs(t, got.err, want.err)
	}
}

func TestCheckAssignment(t *testing.T) {
	pod := caller{id: "spiffe://example.org/task/5/epoch/3", task: 5, epoch: 3}
	guest := caller{id: "guest of task 5 epoch 3", task: 5, epoch: 3, guest: true}
	stale := caller{id: "spiffe://example.org/task/5/epoch/2", task: 5, epoch: 2}
	unavailable := errors.New("nats: timeout")
	tests := []struct {
		name string
		c    caller
		st   assignment.State
		err  error
		want *verdict
	}{
		{name: "the caller's", c: pod, st: asg(assignment.Started, assignment.BackendPod)},
		{name: "the caller's, claim record", c: pod, st: asg(assignment.Claimed, assignment.BackendPod)},
		{name: "a guest's vm assignment", c: guest, st: asg(assignment.Running, assignment.BackendVM)},
		{name: "no assignment", c: pod, err: fmt.Errorf("eventlog: task 5: %w", assignment.ErrNotFound),
			want: &verdict{reason: "unknown_assignment", code: connect.CodeNotFound}},
		{name: "JetStream unavailable", c: pod, err: unavailable,
			want: &verdict{code: connect.CodeUnavailable, err: unavailable}},
		{name: "a guest asking about a pod assignment", c: guest, st: asg(assignment.Running, assignment.BackendPod),
			want: &verdict{reason: "guest_for_pod", code: connect.CodePermissionDenied}},
		{name: "a stale epoch", c: stale, st: asg(assignment.Running, assignment.BackendPod),
			want: &verdict{reason: "stale_epoch", code: connect.CodeFailedPrecondition, err: assignment.ErrStaleEpoch}},
		{name: "a guest with a stale epoch", c: caller{task: 5, epoch: 2, guest: true}, st: asg(assignment.Running, assignment.BackendVM),
			want: &verdict{reason: "stale_epoch", code: connect.CodeFailedPrecondition, err: assignment.ErrStaleEpoch}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkVerdict(t, tt.want, checkAssignment(tt.c, tt.st, tt.err))
		})
	}
}

func TestCheckRunner(t *testing.T) {
	c := caller{task: 5, epoch: 3}
	tests := []struct {
		name      string
		uuid      string
		leaseOver bool
		want      *verdict
	}{
		{name: "the registered runner", uuid: "runner-a"},
		{name: "another runner", uuid: "runner-b", want: &verdict{reason: "bad_runner_token", code: connect.CodePermissionDenied}},
		{name: "another runner, lease over", uuid: "runner-b", leaseOver: true, want: &verdict{reason: "bad_runner_token", code: connect.CodePermissionDenied}},
		{name: "the registered runner, lease over", uuid: "runner-a", leaseOver: true, want: &verdict{reason: "lease_expired", code: connect.CodeUnauthenticated}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkVerdict(t, tt.want, checkRunner(c, asg(assignment.Running, assignment.BackendPod), tt.uuid, tt.leaseOver))
		})
	}
}

func TestCheckRegister(t *testing.T) {
	c := caller{task: 5, epoch: 3}
	retry := &verdict{code: connect.CodeUnavailable}
	tests := []struct {
		name  string
		phase assignment.Phase
		want  *verdict
	}{
		{name: "claimed: start not recorded", phase: assignment.Claimed, want: retry},
		{name: "dispatched: start not recorded", phase: assignment.Dispatched, want: retry},
		{name: "started", phase: assignment.Started},
		// Later phases are the state machine's to refuse (a replayed token, an ended job).
		{name: "registered", phase: assignment.Registered},
		{name: "failed", phase: assignment.Failed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkVerdict(t, tt.want, checkRegister(c, asg(tt.phase, assignment.BackendPod)))
		})
	}
}

func TestCheckReporting(t *testing.T) {
	c := caller{task: 5, epoch: 3}
	ended := &verdict{reason: "ended", code: connect.CodeFailedPrecondition}
	notRunning := &verdict{code: connect.CodeFailedPrecondition}
	tests := []struct {
		name  string
		phase assignment.Phase
		want  *verdict
	}{
		{name: "running", phase: assignment.Running},
		{name: "completed", phase: assignment.Completed, want: ended},
		{name: "failed", phase: assignment.Failed, want: ended},
		{name: "closed", phase: assignment.Closed, want: ended},
		{name: "registered, not fetched yet", phase: assignment.Registered, want: notRunning},
		{name: "started", phase: assignment.Started, want: notRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkVerdict(t, tt.want, checkReporting(c, asg(tt.phase, assignment.BackendPod)))
		})
	}
}

func TestPlanFetch(t *testing.T) {
	tests := []struct {
		name  string
		phase assignment.Phase
		want  fetchAction
	}{
		{name: "registered: hand the task over", phase: assignment.Registered, want: fetchHand},
		{name: "running: the first answer was lost", phase: assignment.Running, want: fetchAgain},
		{name: "completed", phase: assignment.Completed, want: fetchNothing},
		{name: "failed", phase: assignment.Failed, want: fetchNothing},
		{name: "closed", phase: assignment.Closed, want: fetchNothing},
		{name: "started", phase: assignment.Started, want: fetchNothing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, planFetch(asg(tt.phase, assignment.BackendPod)))
		})
	}
}

func TestPlanRenew(t *testing.T) {
	c := caller{task: 5, epoch: 3}
	tests := []struct {
		name      string
		phase     assignment.Phase
		leaseOver bool
		ended     bool
		want      *verdict
	}{
		{name: "running: renew", phase: assignment.Running},
		{name: "started: renew", phase: assignment.Started},
		{name: "running, lease over", phase: assignment.Running, leaseOver: true,
			want: &verdict{reason: "lease_expired", code: connect.CodeFailedPrecondition}},
		{name: "failed: ended", phase: assignment.Failed, ended: true},
		{name: "completed: ended", phase: assignment.Completed, ended: true},
		{name: "closed, lease over: ended", phase: assignment.Closed, leaseOver: true, ended: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ended, v := planRenew(c, asg(tt.phase, assignment.BackendPod), tt.leaseOver)
			assert.Equal(t, tt.ended, ended, "ended")
			checkVerdict(t, tt.want, v)
		})
	}
}
