package assignment

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func claimed(seq uint64) *State {
	rec, err := Decide(nil, Event{Transition: Claimed, Task: 1, At: t0, Backend: BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute})
	if err != nil {
		panic(err)
	}
	return &State{Record: rec, Seq: seq}
}

// advance applies events in order, numbering records from the claim's sequence.
func advance(t *testing.T, s *State, evs ...Event) *State {
	t.Helper()
	for _, ev := range evs {
		ev.Task, ev.Epoch = s.Task, s.Epoch()
		rec, err := Decide(s, ev)
		require.NoError(t, err, "%s", ev.Transition)
		s = &State{Record: rec, Seq: s.Seq + 1}
	}
	return s
}

var (
	evStarted    = Event{Transition: Started, Handle: []byte(`{}`), TokenID: "tok"}
	evRegistered = Event{Transition: Registered, TokenID: "tok", RunnerUUID: "r"}
	evRunning    = Event{Transition: Running, RunnerUUID: "r"}
	evFailed     = Event{Transition: Failed, Reason: "lost", At: t0}
	evReporting  = Event{Transition: Reporting, Actor: "scheduler@a", At: t0, Lease: time.Minute}
)

// TestReportingClaimsTheReportOnce: the first report claim names its reporter and keeps the
// phase failed; another is refused while it holds and accepted once it ran out; closed keeps
// who reported.
func TestReportingClaimsTheReportOnce(t *testing.T) {
	s := advance(t, claimed(4), evFailed, evReporting)
	require.Equal(t, Failed, s.Phase)
	require.Equal(t, Reporting, s.Transition)
	require.Equal(t, "scheduler@a", s.Reporter)
	require.Equal(t, t0.Add(time.Minute), s.ReportUntil)
	require.Equal(t, "lost", s.Reason, "the report claim lost the failure's reason")
	require.True(t, s.Live() && !s.Active(), "a failed assignment being reported is live and not active")

	_, err := Decide(s, Event{Transition: Reporting, Task: 1, Epoch: 4, Actor: "scheduler@b", At: t0.Add(59 * time.Second), Lease: time.Minute})
	require.ErrorIs(t, err, ErrReportClaimed)
	taken := advance(t, s, Event{Transition: Reporting, Actor: "scheduler@b", At: t0.Add(time.Minute), Lease: time.Minute})
	require.Equal(t, "scheduler@b", taken.Reporter, "a report claim that ran out was not taken over")

	closed := advance(t, taken, Event{Transition: Closed, Actor: "scheduler@b", At: t0.Add(61 * time.Second)})
	require.Equal(t, "scheduler@b", closed.Reporter)
	require.Equal(t, "lost", closed.Reason)
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name string
		cur  func(t *testing.T) *State
		ev   Event
		want error
	}{
		{"claim twice", func(*testing.T) *State { return claimed(4) }, Event{Transition: Claimed, Task: 1}, ErrExists},
		{"claim pickup above lease", func(*testing.T) *State { return nil }, Event{Transition: Claimed, Task: 1, Backend: BackendPod, TaskDigest: "d", Lease: time.Minute, Pickup: 2 * time.Minute}, ErrInvalidTransition},
		{"claim unknown backend", func(*testing.T) *State { return nil }, Event{Transition: Claimed, Task: 1, Backend: "gpu", TaskDigest: "d", Lease: 2 * time.Minute, Pickup: time.Minute}, ErrInvalidTransition},
		{"event without assignment", func(*testing.T) *State { return nil }, Event{Transition: Dispatched, Task: 1, Epoch: 4}, ErrNotFound},
		{"stale epoch", func(*testing.T) *State { return claimed(4) }, Event{Transition: Dispatched, Epoch: 3}, ErrStaleEpoch},
		{"dispatch again is no change", func(t *testing.T) *State { return advance(t, claimed(4), Event{Transition: Dispatched}) }, Event{Transition: Dispatched, Epoch: 4}, ErrNoChange},
		{"register before start", func(*testing.T) *State { return claimed(4) }, Event{Transition: Registered, Epoch: 4, TokenID: "tok"}, ErrInvalidTransition},
		{"register with another token", func(t *testing.T) *State { return advance(t, claimed(4), evStarted) }, Event{Transition: Registered, Epoch: 4, TokenID: "old"}, ErrTokenMismatch},
		{"token replay", func(t *testing.T) *State { return advance(t, claimed(4), evStarted, evRegistered) }, Event{Transition: Registered, Epoch: 4, TokenID: "tok"}, ErrTokenRedeemed},
		{"fetch twice", func(t *testing.T) *State { return advance(t, claimed(4), evStarted, evRegistered, evRunning) }, Event{Transition: Running, Epoch: 4, RunnerUUID: "r"}, ErrAlreadyFetched},
		{"fetch by another runner", func(t *testing.T) *State { return advance(t, claimed(4), evStarted, evRegistered) }, Event{Transition: Running, Epoch: 4, RunnerUUID: "x"}, ErrInvalidTransition},
		{"complete before running", func(t *testing.T) *State { return advance(t, claimed(4), evStarted) }, Event{Transition: Completed, Epoch: 4, Result: "success"}, ErrInvalidTransition},
		{"report after the end", func(t *testing.T) *State {
			return advance(t, claimed(4), evStarted, evRegistered, evRunning, Event{Transition: Completed, Result: "success"})
		}, Event{Transition: Renewed, Epoch: 4, Lease: time.Minute}, ErrTerminal},
		{"close without failure", func(t *testing.T) *State { return claimed(4) }, Event{Transition: Closed, Epoch: 4}, ErrInvalidTransition},
		{"fail needs a reason", func(t *testing.T) *State { return claimed(4) }, Event{Transition: Failed, Epoch: 4}, ErrInvalidTransition},
		{"report claim before failure", func(t *testing.T) *State { return claimed(4) }, Event{Transition: Reporting, Epoch: 4, At: t0, Lease: time.Minute}, ErrInvalidTransition},
		{"report claim without a duration", func(t *testing.T) *State { return advance(t, claimed(4), evFailed) }, Event{Transition: Reporting, Epoch: 4, At: t0}, ErrInvalidTransition},
		{"report claim held by another", func(t *testing.T) *State { return advance(t, claimed(4), evFailed, evReporting) },
			Event{Transition: Reporting, Epoch: 4, Actor: "scheduler@b", At: t0.Add(30 * time.Second), Lease: time.Minute}, ErrReportClaimed},
		{"report claim held by itself", func(t *testing.T) *State { return advance(t, claimed(4), evFailed, evReporting) },
			Event{Transition: Reporting, Epoch: 4, Actor: "scheduler@a", At: t0.Add(30 * time.Second), Lease: time.Minute}, ErrReportClaimed},
		{"report claim after close", func(t *testing.T) *State {
			return advance(t, claimed(4), evFailed, evReporting, Event{Transition: Closed})
		},
			Event{Transition: Reporting, Epoch: 4, Actor: "scheduler@b", At: t0.Add(2 * time.Minute), Lease: time.Minute}, ErrTerminal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := tc.cur(t)
			ev := tc.ev
			if ev.Task == 0 && cur != nil {
				ev.Task = cur.Task
			}
			_, err := Decide(cur, ev)
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func TestRenewExtendsLeaseKeepsPhaseAndEpoch(t *testing.T) {
	s := advance(t, claimed(10), evStarted, evRegistered, evRunning)
	renewed := advance(t, s, Event{Transition: Renewed, At: t0.Add(4 * time.Minute), Lease: 5 * time.Minute})
	require.Equal(t, Running, renewed.Phase, "renewal changed phase")
	require.EqualValues(t, 10, renewed.Epoch(), "renewal changed epoch")
	require.True(t, renewed.LeaseExpires.Equal(t0.Add(9*time.Minute)), "lease expires %s, want %s", renewed.LeaseExpires, t0.Add(9*time.Minute))
}

func TestRunningRecordsTheJobStart(t *testing.T) {
	at := t0.Add(90 * time.Second)
	s := advance(t, claimed(10), evStarted, evRegistered, Event{Transition: Running, RunnerUUID: "r", At: at},
		Event{Transition: Renewed, At: at.Add(time.Minute), Lease: 5 * time.Minute}, Event{Transition: Completed, Result: "success", At: at.Add(2 * time.Minute)})
	require.Equal(t, at, s.RunningAt, "the job's start is not kept to its end")
}

func TestStartedByOutlivesLaterActors(t *testing.T) {
	started := evStarted
	started.Actor = "pod-worker@a/1"
	s := advance(t, claimed(10), started, Event{Transition: Registered, TokenID: "tok", RunnerUUID: "r", Actor: "facade@b/2"},
		Event{Transition: Renewed, At: t0, Lease: time.Minute, Actor: "facade@b/2"})
	require.Equal(t, "pod-worker@a/1", s.StartedBy, "started by")
	require.Equal(t, "facade@b/2", s.Actor, "actor")
}

func TestOverdue(t *testing.T) {
	s := claimed(3)
	_, due := Overdue(*s, t0.Add(time.Minute))
	require.False(t, due, "overdue one minute after the claim")
	ev, due := Overdue(*s, t0.Add(2*time.Minute+time.Second))
	require.True(t, due, "pickup deadline: not overdue")
	require.Equal(t, Failed, ev.Transition, "pickup deadline: %+v", ev)
	require.EqualValues(t, 3, ev.Epoch, "pickup deadline: %+v", ev)
	require.NotEmpty(t, ev.Reason, "pickup deadline: %+v", ev)
	running := advance(t, s, evStarted, evRegistered, evRunning)
	_, due = Overdue(*running, t0.Add(3*time.Minute))
	require.False(t, due, "a running assignment with a live lease is overdue")
	_, due = Overdue(*running, t0.Add(6*time.Minute))
	require.True(t, due, "an expired lease is not overdue")
}

// TestDeadlineFailureRecheckedOnCurrentState: a deadline's failure decided on a stale state (a
// view behind the fetch or a renewal) is refused on the current one, which met the deadline;
// on a current state still past a deadline it names that deadline.
func TestDeadlineFailureRecheckedOnCurrentState(t *testing.T) {
	registered := advance(t, claimed(4), evStarted, evRegistered)
	late := t0.Add(2*time.Minute + time.Second)
	ev, due := Overdue(*registered, late)
	require.True(t, due, "the pickup deadline passed in the stale state")
	running := advance(t, registered, evRunning)
	_, err := Decide(running, ev)
	require.ErrorIs(t, err, ErrNotDue, "a fetched task failed for its pickup deadline")

	renewedAt := t0.Add(4 * time.Minute)
	renewed := advance(t, running, Event{Transition: Renewed, At: renewedAt, Lease: 5 * time.Minute})
	ev, due = Overdue(*running, t0.Add(6*time.Minute))
	require.True(t, due, "the lease expired in the stale state")
	_, err = Decide(renewed, ev)
	require.ErrorIs(t, err, ErrNotDue, "a renewed lease failed as expired")

	ev, due = Overdue(*registered, t0.Add(10*time.Minute))
	require.True(t, due)
	rec, err := Decide(renewed, ev)
	require.NoError(t, err, "a lease past its renewal too is not failed")
	require.Equal(t, Failed, rec.Phase)
	require.Contains(t, rec.Reason, "lease expired", "the reason is the current state's deadline")
}

// TestDecideProperties drives random event sequences and checks the state machine's
// invariants: the epoch never changes, terminal phases absorb everything, a token is redeemed
// at most once and the task handed over at most once.
func TestDecideProperties(t *testing.T) {
	kinds := []Transition{Admitted, Dispatched, Started, Registered, Running, Renewed, Completed, Failed, Reporting, Closed}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		s := claimed(7)
		registered, fetched := 0, 0
		for range 12 {
			ev := Event{Transition: kinds[r.IntN(len(kinds))], Task: 1, Epoch: s.Epoch(), At: t0,
				Handle: []byte(`{}`), TokenID: "tok", RunnerUUID: "r", Result: "success", Reason: "x", Lease: time.Minute}
			if r.IntN(8) == 0 {
				ev.Epoch++ // a stale or forged epoch
			}
			rec, err := Decide(s, ev)
			if err != nil {
				if ev.Epoch != s.Epoch() {
					require.ErrorIs(t, err, ErrStaleEpoch, "wrong epoch not rejected as stale")
				}
				continue
			}
			require.Equal(t, s.Epoch(), ev.Epoch, "accepted %s with epoch %d, current %d", ev.Transition, ev.Epoch, s.Epoch())
			require.False(t, Terminal(s.Phase), "%s accepted after terminal %s", ev.Transition, s.Phase)
			next := &State{Record: rec, Seq: s.Seq + 1}
			require.EqualValues(t, 7, next.Epoch(), "epoch changed to %d by %s", next.Epoch(), ev.Transition)
			if rec.Transition == Registered {
				registered++
			}
			if rec.Transition == Running {
				fetched++
			}
			s = next
		}
		require.LessOrEqual(t, registered, 1, "token redeemed %d times, task handed over %d times", registered, fetched)
		require.LessOrEqual(t, fetched, 1, "token redeemed %d times, task handed over %d times", registered, fetched)
	}
}

func queuedClaim(seq uint64) *State {
	rec, err := Decide(nil, Event{Transition: Claimed, Task: 1, At: t0, Backend: BackendPod, TaskDigest: "d",
		Lease: 5 * time.Minute, Pickup: 2 * time.Minute, Queue: 30 * time.Minute})
	if err != nil {
		panic(err)
	}
	return &State{Record: rec, Seq: seq}
}

// TestQueuedClaimWaitsThenAdmitted: a queued claim holds no capacity and has no pickup or lease
// deadline until admitted; admission restores phase claimed and starts both deadlines; only
// the queue deadline fails a queued claim.
func TestQueuedClaimWaitsThenAdmitted(t *testing.T) {
	q := queuedClaim(9)
	require.Equal(t, Queued, q.Phase)
	require.Equal(t, Claimed, q.Transition)
	require.EqualValues(t, 9, q.Epoch())
	require.True(t, q.Active() && !q.InFlight(), "a queued claim is active and not in flight")
	require.Equal(t, t0.Add(30*time.Minute), q.QueueDeadline)

	_, err := Decide(q, Event{Transition: Dispatched, Task: 1, Epoch: 9})
	require.ErrorIs(t, err, ErrInvalidTransition, "a queued claim was dispatched")
	_, err = Decide(q, Event{Transition: Started, Task: 1, Epoch: 9, Handle: []byte(`{}`), TokenID: "tok"})
	require.ErrorIs(t, err, ErrInvalidTransition, "a queued claim was started")

	_, due := Overdue(*q, t0.Add(10*time.Minute))
	require.False(t, due, "a queued claim failed on its pickup deadline or lease while it waited")
	ev, due := Overdue(*q, t0.Add(31*time.Minute))
	require.True(t, due)
	require.Contains(t, ev.Reason, "the fleet was full")
	require.Contains(t, ev.Reason, "QUEUE_SECS")

	at := t0.Add(29 * time.Minute)
	a := advance(t, q, Event{Transition: Admitted, At: at, Pickup: 2 * time.Minute, Lease: 5 * time.Minute})
	require.Equal(t, Claimed, a.Phase)
	require.Equal(t, Admitted, a.Transition)
	require.EqualValues(t, 9, a.Epoch(), "admission changed the epoch")
	require.True(t, a.InFlight())
	require.Equal(t, at, a.AdmittedAt)
	require.Equal(t, at.Add(2*time.Minute), a.PickupDeadline, "the pickup deadline does not count from admission")
	require.Equal(t, at.Add(5*time.Minute), a.LeaseExpires)
	_, due = Overdue(*a, t0.Add(31*time.Minute))
	require.False(t, due, "an admitted claim failed on its queue deadline")
	ev, due = Overdue(*a, at.Add(2*time.Minute+time.Second))
	require.True(t, due)
	require.Contains(t, ev.Reason, "of its admission (PICKUP_SECS)")

	_, err = Decide(a, Event{Transition: Admitted, Task: 1, Epoch: 9, At: at, Pickup: time.Minute, Lease: 5 * time.Minute})
	require.ErrorIs(t, err, ErrNoChange, "a retried admission is not idempotent")
	_, err = Decide(claimed(4), Event{Transition: Admitted, Task: 1, Epoch: 4, At: at, Pickup: time.Minute, Lease: 5 * time.Minute})
	require.ErrorIs(t, err, ErrInvalidTransition, "a claim that never queued was admitted")
	_, err = Decide(q, Event{Transition: Admitted, Task: 1, Epoch: 9, At: at})
	require.ErrorIs(t, err, ErrInvalidTransition, "admitted without deadlines")
	d := advance(t, a, Event{Transition: Dispatched})
	require.Equal(t, Dispatched, d.Phase)
	f := advance(t, queuedClaim(3), Event{Transition: Failed, Reason: "cancelled", At: t0})
	require.Equal(t, Failed, f.Phase, "a queued claim cannot fail")
}

func TestOwnerOf(t *testing.T) {
	require.Equal(t, "acme", OwnerOf("ACME/widgets"))
	require.Equal(t, "solo", OwnerOf("solo"))
	require.Empty(t, OwnerOf(""))
}

func TestRenewEvery(t *testing.T) {
	tests := []struct {
		name  string
		lease time.Duration
		want  time.Duration
	}{
		{name: "default lease", lease: 300 * time.Second, want: 100 * time.Second},
		{name: "shortest lease", lease: 90 * time.Second, want: 30 * time.Second},
		{name: "not a multiple of three seconds", lease: 100 * time.Second, want: 33 * time.Second},
		{name: "fractional lease", lease: 301*time.Second + 500*time.Millisecond, want: 100 * time.Second},
		{name: "under three seconds", lease: 2 * time.Second, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := RenewEvery(tt.lease)
			require.Equal(t, tt.want, got)
			// What the pod worker computed before, and what the VM grant carried (whole seconds
			// of a third of the lease): both unchanged.
			require.Equal(t, time.Duration(int(tt.lease.Seconds())/3)*time.Second, got, "pod environment")
			require.Equal(t, int((tt.lease / 3).Seconds()), int(got.Seconds()), "VM grant")
		})
	}
}
