package scheduler

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/lease"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
)

// replicas is a JetStream shared by scheduler replicas, each with its own event log and view
// (as separate processes have), and the lease TTL of the bucket.
type replicas struct {
	t   testing.TB
	js  jetstream.JetStream
	ttl time.Duration
	box *sealbox.Box
}

func newReplicas(t testing.TB) *replicas {
	t.Helper()
	_, js := eventlogtest.Connect(t)
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	return &replicas{t: t, js: js, ttl: lease.MinTTL, box: box}
}

// replica is one scheduler process: its log, view and Scheduler, not yet running.
type replica struct {
	s    *Scheduler
	log  *eventlog.Log
	view *eventlog.View
}

// open builds a scheduler named actor on the shared JetStream that talks to forge f.
func (r *replicas) open(actor string, f *forgetest.Forge) *replica {
	r.t.Helper()
	cfg := eventlog.DefaultConfig()
	cfg.Key, cfg.LeasesTTL = eventlogtest.Key, r.ttl
	l, err := eventlog.Open(r.t.Context(), r.js, cfg)
	require.NoError(r.t, err)
	v := eventlog.NewView()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Watch(ctx, v) }()
	r.t.Cleanup(func() { cancel(); <-done })
	s := New(Config{
		Actor: actor, Backends: []assignment.Backend{assignment.BackendPod},
		Lease: 5 * time.Minute, Pickup: 2 * time.Minute, FetchInterval: 20 * time.Millisecond, FetchIntervalMax: 100 * time.Millisecond,
		Keepalive: time.Minute, Reconcile: 20 * time.Millisecond, Box: r.box,
		Log: zerolog.New(zerolog.NewTestWriter(r.t)).With().Str("actor", actor).Logger(),
	}, f, l, v)
	s.started = time.Now().Add(-time.Hour) // past the restart grace, for tests that drive reconcile by hand
	return &replica{s: s, log: l, view: v}
}

// run runs the replica's scheduler until the returned stop is called (or the test ends).
func (r *replica) run(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			assert.NoError(t, <-done, "Run on cancellation")
		})
	}
	t.Cleanup(stop)
	return stop
}

// held reads the replica's dynrunner_scheduler_reconcile_lease_held.
func (r *replica) held() float64 { return testutil.ToFloat64(r.s.cfg.Metrics.LeaseHeld) }

// seen waits until the replica's view holds task's assignment in phase.
func (r *replica) seen(t *testing.T, task assignment.TaskID, phase assignment.Phase) {
	t.Helper()
	eventually(t, "the view sees the assignment "+string(phase), func() bool {
		for _, st := range r.view.Live() {
			if st.Task == task && st.Phase == phase {
				return true
			}
		}
		return false
	})
}

// eventually polls cond every 10ms for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 10*time.Millisecond, "timed out waiting for %s", what)
}

// claimed appends a claim for task as another component would, and returns it.
func claimed(t *testing.T, l *eventlog.Log, task assignment.TaskID) assignment.State {
	t.Helper()
	st, err := l.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: task, Actor: "test", At: time.Now(),
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(t, err)
	return st
}

// failed claims task and fails it, as a pod worker does when its environment dies.
func failed(t *testing.T, l *eventlog.Log, task assignment.TaskID) assignment.State {
	t.Helper()
	st := claimed(t, l, task)
	st, err := l.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: task, Epoch: st.Epoch(), Actor: "pod-worker@test",
		At: time.Now(), Reason: "the environment died"}, &st)
	require.NoError(t, err)
	return st
}

// TestTwoSchedulersReportAFailureOnce: two replicas run against one JetStream and one forge; an
// assignment fails. The forge hears of the failure exactly once, from the holder of the
// reconcile lease, and exactly one replica holds it.
func TestTwoSchedulersReportAFailureOnce(t *testing.T) {
	rs := newReplicas(t)
	f := forgetest.New()
	a, b := rs.open("scheduler@a", f), rs.open("scheduler@b", f)
	a.run(t)
	b.run(t)
	eventually(t, "one replica holding the lease", func() bool { return a.held()+b.held() == 1 })
	holder := "scheduler@a"
	if b.held() == 1 {
		holder = "scheduler@b"
	}

	failed(t, a.log, 7)
	eventually(t, "the closed record", func() bool {
		st, err := a.log.Get(t.Context(), 7)
		return err == nil && st.Phase == assignment.Closed
	})
	st, err := a.log.Get(t.Context(), 7)
	require.NoError(t, err)
	assert.Equal(t, holder, st.Reporter, "the failure was reported by a replica without the lease")
	assert.Equal(t, 1, f.Results(7), "failure reports the forge received")
	assert.Equal(t, 1.0, a.held()+b.held(), "replicas holding the lease")
}

// TestConcurrentReportersReportOnce: two replicas that both believe they must report one
// failure (a holder that paused past its lease and its successor) race; the report claim
// (`reporting`, by compare-and-swap) lets one report. Without it both would.
func TestConcurrentReportersReportOnce(t *testing.T) {
	rs := newReplicas(t)
	f := forgetest.New()
	a, b := rs.open("scheduler@a", f), rs.open("scheduler@b", f)
	for i := range 10 {
		task := assignment.TaskID(100 + i)
		st := failed(t, a.log, task)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, r := range []*replica{a, b} {
			wg.Go(func() {
				<-start
				assert.NoError(t, r.s.closeFailed(t.Context(), st))
			})
		}
		close(start)
		wg.Wait()
		assert.Equal(t, 1, f.Results(int64(task)), "task %d: failure reports the forge received", task)
		got, err := a.log.Get(t.Context(), task)
		require.NoError(t, err)
		assert.Equal(t, assignment.Closed, got.Phase, "task %d", task)
	}
}

// TestOnlyTheHolderKeepsTasksAlive: a claimed task needs a keepalive; of two replicas that see
// it, only the lease's holder sends one.
func TestOnlyTheHolderKeepsTasksAlive(t *testing.T) {
	rs := newReplicas(t)
	fa, fb := forgetest.New(), forgetest.New()
	a, b := rs.open("scheduler@a", fa), rs.open("scheduler@b", fb)
	ctx := t.Context()
	a.s.lease.Renew(ctx)
	b.s.lease.Renew(ctx)
	require.True(t, a.s.lease.Held(), "the first replica did not take the free lease")
	require.False(t, b.s.lease.Held(), "the second replica took a held lease")

	claimed(t, a.log, 9)
	a.seen(t, 9, assignment.Claimed)
	b.seen(t, 9, assignment.Claimed)
	b.s.reconcile(ctx)
	a.s.reconcile(ctx)
	assert.Equal(t, 0, fb.Reports(9), "keepalives from the replica without the lease")
	assert.Equal(t, 1, fa.Reports(9), "keepalives from the holder")
}

// TestLeaseHandsOverWhenTheHolderStops: the holder stops; it releases the lease, so the other
// replica's next try takes it, long before the key would have expired, and it reports the
// next failure.
func TestLeaseHandsOverWhenTheHolderStops(t *testing.T) {
	rs := newReplicas(t)
	rs.ttl = time.Minute // a handover by expiry would take a minute: this one must not wait for it
	f := forgetest.New()
	a, b := rs.open("scheduler@a", f), rs.open("scheduler@b", f)
	stopA := a.run(t)
	eventually(t, "the first replica holding the lease", func() bool { return a.held() == 1 })
	ctx := t.Context()
	b.s.lease.Renew(ctx)
	require.False(t, b.s.lease.Held(), "the second replica took a held lease")

	stopA()
	assert.Zero(t, a.held(), "the stopped replica still reports the lease held")
	b.s.lease.Renew(ctx)
	require.True(t, b.s.lease.Held(), "the second replica did not take the released lease")

	b.run(t)
	eventually(t, "the new holder's gauge", func() bool { return b.held() == 1 })
	failed(t, b.log, 8)
	eventually(t, "the new holder reports", func() bool { return f.Results(8) == 1 })
	eventually(t, "the closed record", func() bool {
		st, err := b.log.Get(t.Context(), 8)
		return err == nil && st.Phase == assignment.Closed && st.Reporter == "scheduler@b"
	})
}

// TestLeaseHandsOverWhenTheHolderDies: the holder stops renewing without releasing (killed);
// the other replica takes the lease once the key expired, and not before.
func TestLeaseHandsOverWhenTheHolderDies(t *testing.T) {
	rs := newReplicas(t)
	a, b := rs.open("scheduler@a", forgetest.New()), rs.open("scheduler@b", forgetest.New())
	ctx := t.Context()
	a.s.lease.Renew(ctx)
	require.True(t, a.s.lease.Held())
	took := time.Now()
	b.s.lease.Renew(ctx)
	require.False(t, b.s.lease.Held(), "taken while the holder's key lives")
	require.Eventually(t, func() bool { b.s.lease.Renew(ctx); return b.s.lease.Held() }, 3*rs.ttl+5*time.Second, 100*time.Millisecond,
		"the lease of a dead holder was not taken over")
	assert.GreaterOrEqual(t, time.Since(took), rs.ttl, "the lease was taken over before it expired")
}

// TestPausedHolderDoesNotAct: the holder pauses (its clock runs on while it renews nothing)
// past its lease. Back, it believes it no longer holds the lease and reports nothing, even
// before another replica took over; the replica that takes over reports the failure once.
func TestPausedHolderDoesNotAct(t *testing.T) {
	rs := newReplicas(t)
	f := forgetest.New()
	a, b := rs.open("scheduler@a", f), rs.open("scheduler@b", f)
	clk := &fakeClock{now: time.Now()}
	a.s.lease = lease.New(a.log.Leases(), LeaseReconcile, "scheduler@a", rs.ttl, zerolog.Nop(), nil, lease.WithClock(clk.Now))
	ctx := t.Context()
	a.s.lease.Renew(ctx)
	require.True(t, a.s.lease.Held())

	failed(t, b.log, 6)
	a.seen(t, 6, assignment.Failed)
	clk.Advance(rs.ttl) // the pause
	require.False(t, a.s.lease.Held(), "a holder paused for its whole lease still believes it holds it")
	a.s.reconcile(ctx)
	assert.Zero(t, f.Results(6), "the paused holder reported the failure")
	assert.Zero(t, f.Reports(6), "the paused holder called the forge")

	require.Eventually(t, func() bool { b.s.lease.Renew(ctx); return b.s.lease.Held() }, 3*rs.ttl+5*time.Second, 100*time.Millisecond,
		"the other replica did not take the lease over")
	b.seen(t, 6, assignment.Failed)
	b.s.reconcile(ctx)
	a.s.reconcile(ctx)
	assert.Equal(t, 1, f.Results(6), "failure reports the forge received")
}

// TestRacingSchedulersClaimATaskOnce: the forge hands one task to two replicas (Gitea hands a
// task out once, but a replica's retried fetch or a forge bug must not make two owners).
// There is one claim, the stored sealed task is the claim's, one dispatch, and the replica that
// lost neither fails the task upstream nor touches the winner's sealed task.
func TestRacingSchedulersClaimATaskOnce(t *testing.T) {
	for round := range 3 {
		t.Run("round", func(t *testing.T) {
			rs := newReplicas(t)
			fa, fb := forgetest.New(), forgetest.New()
			a, b := rs.open("scheduler@a", fa), rs.open("scheduler@b", fb)
			id := int64(40 + round)
			fa.Push(forgetest.Task(id))
			fb.Push(forgetest.Task(id))
			a.run(t)
			b.run(t)
			eventually(t, "both replicas fetched the task", func() bool { return fa.Fetches() > 1 && fb.Fetches() > 1 })
			st, err := a.log.Get(t.Context(), assignment.TaskID(id))
			require.NoError(t, err, "no claim")

			stream, err := rs.js.Stream(t.Context(), eventlog.StreamAssignments)
			require.NoError(t, err)
			claimSubject := eventlog.RecordSubject(assignment.TaskID(id), assignment.Claimed)
			info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(claimSubject))
			require.NoError(t, err)
			assert.Equal(t, uint64(1), info.State.Subjects[claimSubject], "claim records")
			sealed, err := a.log.GetTask(t.Context(), assignment.TaskID(id))
			require.NoError(t, err, "the sealed task is gone")
			_, err = sealedtask.Open(rs.box, assignment.TaskID(id), sealed, st.TaskDigest)
			require.NoError(t, err, "the stored sealed task is not the claim's")
			claimedBy := testutil.ToFloat64(a.s.cfg.Metrics.Claimed.WithLabelValues("pod")) + testutil.ToFloat64(b.s.cfg.Metrics.Claimed.WithLabelValues("pod"))
			assert.Equal(t, 1.0, claimedBy, "replicas that counted the task as claimed")
			assert.Zero(t, fa.Results(id)+fb.Results(id), "the task was failed upstream")
		})
	}
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// BenchmarkReconcile10k is one reconcile pass of the lease's holder over 10,000 live
// assignments that need nothing (kept alive, within their deadlines): what every scheduler
// pass costs a busy fleet (Config.Reconcile, 1 s by default). /admission enables the queue
// (MAX_QUEUED), so the pass also plans admissions over the 10,000 (none queued, capacity
// left).
func BenchmarkReconcile10k(b *testing.B) {
	for _, mode := range []string{"plain", "admission"} {
		b.Run(mode, func(b *testing.B) {
			const n = 10_000
			rs := newReplicas(b)
			rs.ttl = time.Minute // held through the setup and every pass measured, without Run renewing it
			a := rs.open("scheduler@a", forgetest.New())
			if mode == "admission" {
				a.s.cfg.Admission = Admission{MaxQueued: 100, Queue: time.Hour, Fairness: FairnessOwner}
				a.s.cfg.CapacityOf = func() (map[assignment.Backend]int, bool) {
					return map[assignment.Backend]int{assignment.BackendPod: 2 * n}, true
				}
			}
			ctx := b.Context()
			a.s.lease.Renew(ctx)
			require.True(b, a.s.lease.Held())
			for i := range n {
				_, err := a.log.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: assignment.TaskID(i + 1), Actor: "test", At: time.Now(),
					Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
				require.NoError(b, err)
			}
			require.Eventually(b, func() bool { return len(a.view.LiveTasks()) == n }, 30*time.Second, 10*time.Millisecond)
			a.s.reconcile(ctx) // the first pass keeps every task alive; the next ones have nothing to do
			b.ReportAllocs()
			for b.Loop() {
				a.s.reconcile(ctx)
			}
			b.StopTimer()
			require.True(b, a.s.lease.Held(), "the lease lapsed: the passes measured returned early")
		})
	}
}
