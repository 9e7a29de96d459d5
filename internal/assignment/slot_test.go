package assignment

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const slot = SlotBase + 17

func slotClaimed(t *testing.T, seq uint64) *State {
	t.Helper()
	rec, err := Decide(nil, Event{Transition: Claimed, Task: slot, At: t0, Backend: BackendVM, Forge: ForgeGitHub,
		ScaleSet: 3, RunnerName: "dynrunner-vm-17", Lease: 6 * time.Hour, Pickup: 10 * time.Minute})
	require.NoError(t, err)
	return &State{Record: rec, Seq: seq}
}

var (
	evConfigured = Event{Transition: Configured, RunnerID: 41, TaskDigest: "jit"}
	evSlotStart  = Event{Transition: Started, Handle: []byte(`{"pid":1}`)}
	evJobStarted = Event{Transition: Running, At: t0, RunnerID: 41, GitHubJob: "job-1", RunID: 9, Repo: "acme/app", Job: "build"}
)

// TestSlotLifecycle: a GitHub slot goes claimed, configured, dispatched, started, running (the
// job GitHub gave its runner), completed; it keeps its epoch, scale set and runner throughout.
func TestSlotLifecycle(t *testing.T) {
	s := slotClaimed(t, 8)
	assert.True(t, s.GitHub())
	assert.False(t, s.Ready(), "a slot without a runner is ready")
	assert.Empty(t, s.TaskDigest)
	s = advance(t, s, evConfigured)
	assert.Equal(t, Claimed, s.Phase, "configured changed the phase")
	assert.True(t, s.Ready())
	s = advance(t, s, Event{Transition: Dispatched}, evSlotStart, evJobStarted, Event{Transition: Completed, Result: "succeeded"})
	assert.Equal(t, Completed, s.Phase)
	assert.EqualValues(t, 8, s.Epoch())
	assert.Equal(t, 3, s.ScaleSet)
	assert.Equal(t, "dynrunner-vm-17", s.RunnerName)
	assert.EqualValues(t, 41, s.RunnerID)
	assert.Equal(t, "job-1", s.GitHubJob)
	assert.EqualValues(t, 9, s.RunID)
	assert.Equal(t, "acme/app", s.Repo)
	assert.Equal(t, "build", s.Job)
	assert.Equal(t, "jit", s.TaskDigest)
	assert.Equal(t, t0, s.RunningAt)
}

// TestSlotJobStartedBeforeTheStart: GitHub's JobStarted may be recorded before the worker
// records the environment's start; the start is then recorded and the phase stays running.
func TestSlotJobStartedBeforeTheStart(t *testing.T) {
	s := advance(t, slotClaimed(t, 8), evConfigured, Event{Transition: Dispatched}, evJobStarted, evSlotStart)
	assert.Equal(t, Running, s.Phase)
	assert.JSONEq(t, `{"pid":1}`, string(s.Handle))
	_, err := Decide(s, Event{Transition: Started, Task: slot, Epoch: 8, Handle: []byte(`{"pid":1}`)})
	require.ErrorIs(t, err, ErrNoChange)
	_, err = Decide(s, Event{Transition: Started, Task: slot, Epoch: 8, Handle: []byte(`{"pid":2}`)})
	require.ErrorIs(t, err, ErrInvalidTransition, "a second environment was recorded for a running slot")
}

func TestDecideSlots(t *testing.T) {
	configured := func(t *testing.T) *State { return advance(t, slotClaimed(t, 8), evConfigured) }
	for _, tc := range []struct {
		name string
		cur  func(t *testing.T) *State
		ev   Event
		want error
	}{
		{"gitea claim in the slot range", func(*testing.T) *State { return nil },
			Event{Transition: Claimed, Task: slot, Backend: BackendPod, TaskDigest: "d", Lease: time.Hour, Pickup: time.Minute}, ErrInvalidTransition},
		{"slot claim below the slot range", func(*testing.T) *State { return nil },
			Event{Transition: Claimed, Task: 5, Forge: ForgeGitHub, ScaleSet: 1, RunnerName: "r", Backend: BackendPod, Lease: time.Hour, Pickup: time.Minute}, ErrInvalidTransition},
		{"slot claim without a runner name", func(*testing.T) *State { return nil },
			Event{Transition: Claimed, Task: slot, Forge: ForgeGitHub, ScaleSet: 1, Backend: BackendPod, Lease: time.Hour, Pickup: time.Minute}, ErrInvalidTransition},
		{"slot claim without a scale set", func(*testing.T) *State { return nil },
			Event{Transition: Claimed, Task: slot, Forge: ForgeGitHub, RunnerName: "r", Backend: BackendPod, Lease: time.Hour, Pickup: time.Minute}, ErrInvalidTransition},
		{"slot claim queued", func(*testing.T) *State { return nil },
			Event{Transition: Claimed, Task: slot, Forge: ForgeGitHub, ScaleSet: 1, RunnerName: "r", Backend: BackendPod, Lease: time.Hour, Pickup: time.Minute, Queue: time.Minute}, ErrInvalidTransition},
		{"claim from an unknown forge", func(*testing.T) *State { return nil },
			Event{Transition: Claimed, Task: slot, Forge: "gitlab", Backend: BackendPod, TaskDigest: "d", Lease: time.Hour, Pickup: time.Minute}, ErrInvalidTransition},
		{"configured on a gitea task", func(*testing.T) *State { return claimed(4) }, Event{Transition: Configured, Epoch: 4, RunnerID: 1, TaskDigest: "x"}, ErrInvalidTransition},
		{"configured without a runner", func(t *testing.T) *State { return slotClaimed(t, 8) }, Event{Transition: Configured, Epoch: 8, TaskDigest: "x"}, ErrInvalidTransition},
		{"configured without a sealed configuration", func(t *testing.T) *State { return slotClaimed(t, 8) }, Event{Transition: Configured, Epoch: 8, RunnerID: 41}, ErrInvalidTransition},
		{"configured again", configured, Event{Transition: Configured, Epoch: 8, RunnerID: 41, TaskDigest: "jit"}, ErrNoChange},
		{"configured for a second runner", configured, Event{Transition: Configured, Epoch: 8, RunnerID: 42, TaskDigest: "jit2"}, ErrInvalidTransition},
		{"configured after dispatch", func(t *testing.T) *State { return advance(t, configured(t), Event{Transition: Dispatched}) },
			Event{Transition: Configured, Epoch: 8, RunnerID: 42, TaskDigest: "jit2"}, ErrInvalidTransition},
		{"configured again after dispatch, from a view behind the log", func(t *testing.T) *State { return advance(t, configured(t), Event{Transition: Dispatched}) },
			Event{Transition: Configured, Epoch: 8, RunnerID: 41, TaskDigest: "jit"}, ErrNoChange},
		{"configured again while its job runs", func(t *testing.T) *State { return advance(t, configured(t), evJobStarted) },
			Event{Transition: Configured, Epoch: 8, RunnerID: 41, TaskDigest: "jit"}, ErrNoChange},
		{"dispatched before configured", func(t *testing.T) *State { return slotClaimed(t, 8) }, Event{Transition: Dispatched, Epoch: 8}, ErrInvalidTransition},
		{"started before configured", func(t *testing.T) *State { return slotClaimed(t, 8) }, Event{Transition: Started, Epoch: 8, Handle: []byte(`{}`)}, ErrInvalidTransition},
		{"started without a handle", configured, Event{Transition: Started, Epoch: 8}, ErrInvalidTransition},
		{"registered: a slot has no facade", func(t *testing.T) *State { return advance(t, configured(t), evSlotStart) },
			Event{Transition: Registered, Epoch: 8, TokenID: "tok"}, ErrInvalidTransition},
		{"job started before configured", func(t *testing.T) *State { return slotClaimed(t, 8) },
			Event{Transition: Running, Epoch: 8, RunnerID: 41, GitHubJob: "j"}, ErrInvalidTransition},
		{"job started on another runner", configured, Event{Transition: Running, Epoch: 8, RunnerID: 99, GitHubJob: "j"}, ErrInvalidTransition},
		{"job started without a job", configured, Event{Transition: Running, Epoch: 8, RunnerID: 41}, ErrInvalidTransition},
		{"the same job started again", func(t *testing.T) *State { return advance(t, configured(t), evJobStarted) },
			Event{Transition: Running, Epoch: 8, RunnerID: 41, GitHubJob: "job-1"}, ErrNoChange},
		{"a second job on a single-use runner", func(t *testing.T) *State { return advance(t, configured(t), evJobStarted) },
			Event{Transition: Running, Epoch: 8, RunnerID: 41, GitHubJob: "job-2"}, ErrAlreadyFetched},
		{"completed before its job started", func(t *testing.T) *State { return advance(t, configured(t), evSlotStart) },
			Event{Transition: Completed, Epoch: 8, Result: "succeeded"}, ErrInvalidTransition},
		{"job started with a stale epoch", configured, Event{Transition: Running, Epoch: 7, RunnerID: 41, GitHubJob: "j"}, ErrStaleEpoch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := tc.cur(t)
			ev := tc.ev
			if ev.Task == 0 {
				ev.Task = slot
				if cur != nil {
					ev.Task = cur.Task
				}
			}
			_, err := Decide(cur, ev)
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// TestSlotOverdue: a slot whose runner got no job fails at its pickup deadline, saying so in
// GitHub's terms; a running one only at its lease.
func TestSlotOverdue(t *testing.T) {
	s := advance(t, slotClaimed(t, 8), evConfigured, Event{Transition: Dispatched}, evSlotStart)
	_, due := Overdue(*s, t0.Add(10*time.Minute))
	assert.False(t, due)
	ev, due := Overdue(*s, t0.Add(10*time.Minute+time.Second))
	require.True(t, due)
	assert.Contains(t, ev.Reason, "GitHub gave the slot's runner no job within 10m0s")

	running := advance(t, s, evJobStarted)
	_, due = Overdue(*running, t0.Add(time.Hour))
	assert.False(t, due, "a running slot failed at its pickup deadline")
	ev, due = Overdue(*running, t0.Add(6*time.Hour+time.Second))
	require.True(t, due)
	assert.Contains(t, ev.Reason, "a slot is not renewed")
}

// TestSlotLost: a failure that lost the environment says so, and the mark stays through the
// report and the close; a deadline's failure is never a loss, even when asked to be one.
func TestSlotLost(t *testing.T) {
	running := advance(t, slotClaimed(t, 8), evConfigured, Event{Transition: Dispatched}, evSlotStart, evJobStarted)
	lost := advance(t, running, Event{Transition: Failed, Reason: "the environment disappeared before the job completed", Lost: true, At: t0})
	assert.True(t, lost.Lost)
	closed := advance(t, lost, Event{Transition: Reporting, Lease: time.Minute, At: t0}, Event{Transition: Closed, At: t0})
	assert.True(t, closed.Lost, "closing the slot forgot that its environment was lost")
	assert.Equal(t, "job-1", closed.GitHubJob)
	assert.EqualValues(t, 9, closed.RunID)
	assert.Equal(t, "acme/app", closed.Repo)

	ev, due := Overdue(*running, t0.Add(6*time.Hour+time.Second))
	require.True(t, due)
	ev.Lost = true
	timedOut := advance(t, running, ev)
	assert.False(t, timedOut.Lost, "a job that ran past its lease was recorded as a lost environment")
	assert.False(t, advance(t, running, Event{Transition: Failed, Reason: "refused", At: t0}).Lost)
}
