package podworker

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/grants"
)

// asg is an assignment of task 7 at epoch in phase, recording handle when it is not nil.
func asg(phase assignment.Phase, epoch assignment.Epoch, handle *Handle) assignment.State {
	st := assignment.State{Record: assignment.Record{Transition: phase, Phase: phase, Task: 7, Epoch: epoch}, Seq: uint64(epoch) + 10}
	if phase == assignment.Claimed {
		st.Record.Epoch, st.Seq = 0, uint64(epoch) // a claim's epoch is its own sequence
	}
	if handle != nil {
		st.Handle, _ = json.Marshal(handle)
	}
	return st
}

func TestPlanDispatch(t *testing.T) {
	h := &Handle{Backend: "mem", ID: "7-3", Task: 7, Epoch: 3}
	d := eventlog.DispatchMsg{Task: 7, Epoch: 3}
	badSig := fmt.Errorf("eventlog: dispatch: %w", eventlog.ErrUnauthenticated)
	notFound := fmt.Errorf("eventlog: task 7: %w", assignment.ErrNotFound)
	unavailable := errors.New("nats: timeout")
	undecodable := asg(assignment.Dispatched, 3, nil)
	undecodable.Handle = json.RawMessage(`"not a handle"`)
	tests := []struct {
		name string
		s    dispatchSnapshot
		want dispatchAction
	}{
		{name: "poison message", s: dispatchSnapshot{parseErr: badSig, delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchPoison, reason: badSig.Error()}},
		{name: "no assignment for the task", s: dispatchSnapshot{d: d, readErr: notFound, delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchOrphan, reason: "no assignment for the task"}},
		{name: "assignment unreadable", s: dispatchSnapshot{d: d, readErr: unavailable, delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchRetry, cause: unavailable}},
		{name: "another epoch", s: dispatchSnapshot{d: d, st: asg(assignment.Claimed, 4, nil), delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchDrop}},
		{name: "failed", s: dispatchSnapshot{d: d, st: asg(assignment.Failed, 3, h), delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchDrop}},
		{name: "completed", s: dispatchSnapshot{d: d, st: asg(assignment.Completed, 3, h), delivered: 2, deliveredOK: true},
			want: dispatchAction{kind: dispatchDrop}},
		{name: "closed", s: dispatchSnapshot{d: d, st: asg(assignment.Closed, 3, h), delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchDrop}},
		{name: "grant does not cover the tier: refuse", s: dispatchSnapshot{d: d, st: asg(assignment.Claimed, 3, nil), refused: grants.ErrNotGranted, delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchRefuse, reason: grants.ErrNotGranted.Error()}},
		{name: "grant does not cover a started one: refuse, not adopt", s: dispatchSnapshot{d: d, st: asg(assignment.Running, 3, h), refused: grants.ErrNotGranted, delivered: 2, deliveredOK: true},
			want: dispatchAction{kind: dispatchRefuse, reason: grants.ErrNotGranted.Error()}},
		{name: "refused but ended: drop", s: dispatchSnapshot{d: d, st: asg(assignment.Failed, 3, h), refused: grants.ErrNotGranted, delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchDrop}},
		{name: "claimed: start", s: dispatchSnapshot{d: d, st: asg(assignment.Claimed, 3, nil), delivered: 1, deliveredOK: true},
			want: dispatchAction{kind: dispatchStart}},
		{name: "dispatched, redelivered: destroy unrecorded environments, start", s: dispatchSnapshot{d: d, st: asg(assignment.Dispatched, 3, nil), delivered: 2, deliveredOK: true},
			want: dispatchAction{kind: dispatchStart, destroyUnrecorded: true}},
		{name: "delivery count unknown: start without destroying", s: dispatchSnapshot{d: d, st: asg(assignment.Dispatched, 3, nil)},
			want: dispatchAction{kind: dispatchStart}},
		{name: "started before: adopt", s: dispatchSnapshot{d: d, st: asg(assignment.Started, 3, h), delivered: 2, deliveredOK: true},
			want: dispatchAction{kind: dispatchAdopt, handle: *h}},
		{name: "running: adopt", s: dispatchSnapshot{d: d, st: asg(assignment.Running, 3, h), delivered: 3, deliveredOK: true},
			want: dispatchAction{kind: dispatchAdopt, handle: *h}},
		{name: "recorded handle undecodable: start again", s: dispatchSnapshot{d: d, st: undecodable, delivered: 2, deliveredOK: true},
			want: dispatchAction{kind: dispatchStart, destroyUnrecorded: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, planDispatch(tt.s))
		})
	}
}

func TestPlanRetry(t *testing.T) {
	const base = 2 * time.Second
	tests := []struct {
		name        string
		delivered   uint64
		deliveredOK bool
		want        retryAction
	}{
		{name: "first delivery", delivered: 1, deliveredOK: true, want: retryAction{delay: base}},
		{name: "delay grows with the deliveries", delivered: 4, deliveredOK: true, want: retryAction{delay: 4 * base}},
		{name: "last delivery", delivered: 5, deliveredOK: true, want: retryAction{giveUp: true}},
		{name: "past the last delivery", delivered: 6, deliveredOK: true, want: retryAction{giveUp: true}},
		{name: "delivery count unknown", want: retryAction{giveUp: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, planRetry(tt.delivered, tt.deliveredOK, 5, base))
		})
	}
}

func TestStartRefused(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "stale epoch", err: fmt.Errorf("eventlog: %w", assignment.ErrStaleEpoch), want: true},
		{name: "ended", err: fmt.Errorf("eventlog: %w", assignment.ErrTerminal), want: true},
		{name: "failed meanwhile", err: fmt.Errorf("eventlog: %w", assignment.ErrInvalidTransition), want: true},
		{name: "JetStream unavailable", err: errors.New("nats: timeout"), want: false},
		{name: "no change", err: assignment.ErrNoChange, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, startRefused(tt.err))
		})
	}
}

func TestPlanSweep(t *testing.T) {
	h := Handle{Backend: "mem", ID: "7-3", Task: 7, Epoch: 3}
	other := Handle{Backend: "mem", ID: "7-3-b", Task: 7, Epoch: 3}
	tests := []struct {
		name string
		e    sweepEnv
		want sweepAction
	}{
		{name: "this worker has the task", e: sweepEnv{h: h, mine: true}, want: sweepMine},
		{name: "no assignment in the view", e: sweepEnv{h: h}, want: sweepReap},
		{name: "recorded, running: adopt", e: sweepEnv{h: h, st: asg(assignment.Running, 3, &h), known: true}, want: sweepAdopt},
		{name: "recorded, started: adopt", e: sweepEnv{h: h, st: asg(assignment.Started, 3, &h), known: true}, want: sweepAdopt},
		{name: "another environment recorded", e: sweepEnv{h: h, st: asg(assignment.Running, 3, &other), known: true}, want: sweepReap},
		{name: "not recorded yet", e: sweepEnv{h: h, st: asg(assignment.Dispatched, 3, nil), known: true}, want: sweepYoung},
		{name: "not recorded yet, claimed", e: sweepEnv{h: h, st: asg(assignment.Claimed, 3, nil), known: true}, want: sweepYoung},
		{name: "another epoch", e: sweepEnv{h: h, st: asg(assignment.Dispatched, 4, nil), known: true}, want: sweepReap},
		{name: "failed", e: sweepEnv{h: h, st: asg(assignment.Failed, 3, &h), known: true}, want: sweepReap},
		{name: "completed", e: sweepEnv{h: h, st: asg(assignment.Completed, 3, &h), known: true}, want: sweepReap},
		{name: "closed, never recorded", e: sweepEnv{h: h, st: asg(assignment.Closed, 3, nil), known: true}, want: sweepReap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, planSweep(tt.e))
		})
	}
}

func TestLostEnvironment(t *testing.T) {
	for _, tt := range []struct {
		exit Exit
		want bool
	}{
		{Exit{Code: 1, Reason: "exited"}, true},
		{Exit{Code: -1, Reason: "killed"}, true},
		{Exit{Code: -1, Reason: "deleted"}, true},
		{Exit{Code: -1, Reason: "evicted"}, true},
		{Exit{Code: -1, Reason: "lost: no such process"}, true},
		{Exit{Code: 137, Reason: ExitOOM}, false},
		{Exit{Code: -1, Reason: ExitDeadline}, false},
	} {
		assert.Equal(t, tt.want, lostEnvironment(tt.exit), "%+v", tt.exit)
	}
}
