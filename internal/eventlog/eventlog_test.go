package eventlog_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// testLog is an event log on an in-process server, and the test's own JetStream handle to that
// server for what the log does not offer (reading a stream's state, deleting one).
type testLog struct {
	*eventlog.Log
	js jetstream.JetStream
}

func openLog(t testing.TB, dir string) (testLog, func()) {
	t.Helper()
	return openLogWith(t, dir, eventlog.DefaultConfig())
}

func openLogWith(t testing.TB, dir string, cfg eventlog.Config) (testLog, func()) {
	t.Helper()
	c, err := natsconn.Connect(natsconn.Config{StoreDir: dir, Name: t.Name()})
	require.NoError(t, err)
	js, err := jetstream.New(c.NC)
	require.NoError(t, err)
	cfg.Key = []byte("0123456789abcdef0123456789abcdef")
	l, err := eventlog.Open(t.Context(), js, cfg)
	require.NoError(t, err)
	return testLog{Log: l, js: js}, c.Close
}

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func claim(task assignment.TaskID) assignment.Event {
	return assignment.Event{Transition: assignment.Claimed, Task: task, Actor: "test", At: t0,
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}
}

func TestLifecycleAndFencing(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()

	s, err := l.Apply(ctx, claim(7), nil)
	require.NoError(t, err)
	epoch := s.Epoch()
	require.NotZero(t, epoch)
	require.Equal(t, s.Seq, uint64(epoch), "the epoch is the claim's sequence")
	_, err = l.Apply(ctx, claim(7), nil)
	require.ErrorIs(t, err, assignment.ErrExists, "second claim")
	steps := []assignment.Event{
		{Transition: assignment.Dispatched},
		{Transition: assignment.Started, Handle: []byte(`{"id":"x"}`), TokenID: "tok"},
		{Transition: assignment.Registered, TokenID: "tok", RunnerUUID: "r"},
		{Transition: assignment.Running, RunnerUUID: "r"},
		{Transition: assignment.Renewed, Lease: time.Minute},
		{Transition: assignment.Completed, Result: "success"},
	}
	for _, ev := range steps {
		ev.Task, ev.Epoch, ev.At, ev.Actor = 7, epoch, t0.Add(time.Minute), "test"
		s, err = l.Apply(ctx, ev, nil)
		require.NoError(t, err, ev.Transition)
		require.Equal(t, epoch, s.Epoch(), "%s changed the epoch", ev.Transition)
	}
	got, err := l.Get(ctx, 7)
	require.NoError(t, err)
	assert.Equal(t, assignment.Completed, got.Phase)
	assert.Equal(t, "success", got.Result)
	assert.Equal(t, s.Seq, got.Seq)

	// A report from a stale epoch is rejected.
	_, err = l.Apply(ctx, claim(8), nil)
	require.NoError(t, err)
	stale := assignment.Event{Transition: assignment.Dispatched, Task: 8, Epoch: epoch, At: t0}
	_, err = l.Apply(ctx, stale, nil)
	require.ErrorIs(t, err, assignment.ErrStaleEpoch)
}

// TestRedeemOnce races many redemptions of one token: exactly one wins, decided by JetStream.
func TestRedeemOnce(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	s, err := l.Apply(ctx, claim(9), nil)
	require.NoError(t, err)
	e := s.Epoch()
	_, err = l.Apply(ctx, assignment.Event{Transition: assignment.Started, Task: 9, Epoch: e, At: t0, Handle: []byte(`{}`), TokenID: "tok"}, nil)
	require.NoError(t, err)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := l.Apply(ctx, assignment.Event{Transition: assignment.Registered, Task: 9, Epoch: e, At: t0, TokenID: "tok", RunnerUUID: "r"}, nil)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	wins := 0
	for err := range errs {
		if err == nil {
			wins++
			continue
		}
		assert.ErrorIs(t, err, assignment.ErrTokenRedeemed)
	}
	require.Equal(t, 1, wins, "redemptions that won")
}

func TestStaleHintIsReread(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	s, err := l.Apply(ctx, claim(3), nil)
	require.NoError(t, err)
	hint := s
	_, err = l.Apply(ctx, assignment.Event{Transition: assignment.Dispatched, Task: 3, Epoch: s.Epoch(), At: t0}, nil)
	require.NoError(t, err)
	// The hint is one append behind; the CAS fails, Apply re-reads and succeeds.
	got, err := l.Apply(ctx, assignment.Event{Transition: assignment.Started, Task: 3, Epoch: s.Epoch(), At: t0, Handle: []byte(`{}`), TokenID: "t"}, &hint)
	require.NoError(t, err)
	require.Equal(t, assignment.Started, got.Phase)
}

// TestDeadlineOnStaleHintIsRecheckedAfterReread: a lease expiry decided on a hint behind a
// renewal loses the compare-and-swap, and the failure is decided again on the assignment read
// back: its lease holds, so nothing is appended.
func TestDeadlineOnStaleHintIsRecheckedAfterReread(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	s, err := l.Apply(ctx, claim(4), nil)
	require.NoError(t, err)
	e := s.Epoch()
	for _, ev := range []assignment.Event{
		{Transition: assignment.Started, Handle: []byte(`{}`), TokenID: "tok"},
		{Transition: assignment.Registered, TokenID: "tok", RunnerUUID: "r"},
		{Transition: assignment.Running, RunnerUUID: "r"},
	} {
		ev.Task, ev.Epoch, ev.At = 4, e, t0
		s, err = l.Apply(ctx, ev, nil)
		require.NoError(t, err, "%s", ev.Transition)
	}
	stale := s
	_, err = l.Apply(ctx, assignment.Event{Transition: assignment.Renewed, Task: 4, Epoch: e, At: t0.Add(4 * time.Minute), Lease: 5 * time.Minute}, nil)
	require.NoError(t, err)

	ev, due := assignment.Overdue(stale, t0.Add(6*time.Minute))
	require.True(t, due, "the stale hint's lease expired")
	got, err := l.Apply(ctx, ev, &stale)
	require.ErrorIs(t, err, assignment.ErrNotDue)
	require.Equal(t, assignment.Running, got.Phase, "the assignment read back")
	cur, err := l.Get(ctx, 4)
	require.NoError(t, err)
	require.Equal(t, assignment.Running, cur.Phase, "a renewed assignment failed on a stale hint")
}

func TestViewSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	l, done := openLog(t, dir)
	for task := assignment.TaskID(1); task <= 5; task++ {
		_, err := l.Apply(t.Context(), claim(task), nil)
		require.NoError(t, err)
	}
	s, err := l.Get(t.Context(), 2)
	require.NoError(t, err)
	_, err = l.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: 2, Epoch: s.Epoch(), At: t0, Reason: "x"}, nil)
	require.NoError(t, err)
	done()

	l, done = openLog(t, dir)
	defer done()
	v := eventlog.NewView()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- l.Watch(ctx, v) }()
	select {
	case <-v.Ready():
	case <-time.After(10 * time.Second):
		require.FailNow(t, "view not ready within 10s")
	}
	assert.Equal(t, 5, v.Len(), "assignments the view holds")
	s, ok := v.Get(2)
	require.True(t, ok)
	assert.Equal(t, assignment.Failed, s.Phase)
	cancel()
	require.NoError(t, <-errc, "Watch on cancellation")
}

func TestDispatchDeduplicates(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	for range 3 {
		require.NoError(t, l.Dispatch(ctx, assignment.BackendPod, 4, 11))
	}
	st, err := l.js.Stream(ctx, eventlog.StreamDispatch)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "messages in the dispatch stream")
}

func TestDropTaskRemovesSecretMaterial(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	require.NoError(t, l.PutTask(ctx, 5, []byte("sealed")))
	got, err := l.GetTask(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, "sealed", string(got))
	require.NoError(t, l.DropTask(ctx, 5))
	_, err = l.GetTask(ctx, 5)
	require.ErrorIs(t, err, assignment.ErrNotFound, "after drop")
	st, err := l.js.Stream(ctx, "KV_"+eventlog.BucketTasks)
	require.NoError(t, err)
	_, err = st.GetMsg(ctx, 1)
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "the sealed task's message is still in the stream")
}

// TestPutTaskNeverOverwrites: a sealed task is stored only if the task has none; the same
// bytes again (a retried claim) are fine, another claim's bytes are refused and not stored.
// After the drop the task may be stored again.
func TestPutTaskNeverOverwrites(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	require.NoError(t, l.PutTask(ctx, 5, []byte("first")))
	require.NoError(t, l.PutTask(ctx, 5, []byte("first")), "storing the same bytes again")
	require.ErrorIs(t, l.PutTask(ctx, 5, []byte("second")), assignment.ErrExists, "another claim's bytes")
	got, err := l.GetTask(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, "first", string(got), "the stored task was overwritten")
	require.NoError(t, l.DropTask(ctx, 5))
	require.NoError(t, l.PutTask(ctx, 5, []byte("second")), "after the drop")
}

func TestParseDispatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"valid", `{"task_id":3,"epoch":9}`, true},
		{"no epoch", `{"task_id":3}`, false},
		{"negative task", `{"task_id":-3,"epoch":1}`, false},
		{"unknown field", `{"task_id":3,"epoch":9,"x":1}`, false},
		{"garbage", `{`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := eventlog.ParseDispatchBody([]byte(tc.in))
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

func FuzzParseDispatch(f *testing.F) {
	f.Add([]byte(`{"task_id":3,"epoch":9}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := eventlog.ParseDispatchBody(data)
		if err != nil {
			return
		}
		require.Positive(t, int64(m.Task), "accepted %+v", m)
		require.NotZero(t, m.Epoch, "accepted %+v", m)
		// What is accepted round-trips: the scheduler's encoding of it parses to the same.
		again, err := json.Marshal(m)
		require.NoError(t, err)
		back, err := eventlog.ParseDispatchBody(again)
		require.NoError(t, err)
		require.Equal(t, m, back)
	})
}

// TestOpenCreatesTheTopology: Open creates every stream and bucket dynrunner uses, the buckets
// with the TTLs of the configuration; opened again as configured, it changes nothing.
func TestOpenCreatesTheTopology(t *testing.T) {
	dir := t.TempDir()
	cfg := eventlog.DefaultConfig()
	cfg.WorkersTTL, cfg.NoncesTTL, cfg.ComponentsTTL = 6*time.Second, 10*time.Minute, 9*time.Second
	l, done := openLogWith(t, dir, cfg)
	defer done()
	ctx := t.Context()
	for _, name := range []string{eventlog.StreamAssignments, eventlog.StreamDispatch, eventlog.StreamDead, eventlog.StreamEnvironments} {
		_, err := l.js.Stream(ctx, name)
		require.NoError(t, err, name)
	}
	for _, tc := range []struct {
		bucket string
		kv     jetstream.KeyValue
		ttl    time.Duration
	}{
		{eventlog.BucketTasks, nil, cfg.Retention},
		{eventlog.BucketWorkers, l.Workers(), cfg.WorkersTTL},
		{eventlog.BucketNonces, l.Nonces(), cfg.NoncesTTL},
		{eventlog.BucketLeases, l.Leases(), cfg.LeasesTTL},
		{eventlog.BucketLive, l.Live(), 0},
		{eventlog.BucketComponents, l.Components(), cfg.ComponentsTTL},
	} {
		kv, err := l.js.KeyValue(ctx, tc.bucket)
		require.NoError(t, err, tc.bucket)
		st, err := kv.Status(ctx)
		require.NoError(t, err, tc.bucket)
		assert.Equal(t, tc.ttl, st.TTL(), tc.bucket)
		assert.Equal(t, uint64(1), uint64(st.History()), tc.bucket)
		if tc.kv != nil {
			assert.Equal(t, tc.bucket, tc.kv.Bucket())
		}
	}
	assert.Equal(t, "dynrunner_workers", eventlog.BucketWorkers, "the bucket's name is part of deploy/nats/permissions.conf")
	assert.Equal(t, "dynrunner_nonces", eventlog.BucketNonces, "the bucket's name is part of deploy/nats/permissions.conf")
	assert.Equal(t, "dynrunner_leases", eventlog.BucketLeases, "the bucket's name is part of deploy/nats/permissions.conf")
	assert.Equal(t, "dynrunner_live", eventlog.BucketLive, "the bucket's name is part of deploy/nats/permissions.conf")
	assert.Equal(t, "dynrunner_components", eventlog.BucketComponents, "the bucket's name is part of deploy/nats/permissions.conf")

	// The defaults stand in for TTLs left zero.
	zero := eventlog.DefaultConfig()
	zero.WorkersTTL, zero.NoncesTTL, zero.LeasesTTL, zero.ComponentsTTL = 0, 0, 0, 0
	d, doneD := openLogWith(t, t.TempDir(), zero)
	defer doneD()
	assert.Equal(t, eventlog.DefaultWorkersTTL, d.Config().WorkersTTL)
	assert.Equal(t, eventlog.DefaultNoncesTTL, d.Config().NoncesTTL)
	assert.Equal(t, eventlog.DefaultLeasesTTL, d.Config().LeasesTTL)
	assert.Equal(t, eventlog.DefaultComponentsTTL, d.Config().ComponentsTTL)
	st, err := d.Workers().Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, eventlog.DefaultWorkersTTL, st.TTL())
	st, err = d.Leases().Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, eventlog.DefaultLeasesTTL, st.TTL())
}

// TestCheckSeesMissingStreams: an operator (or an attacker with the NATS password) deletes the
// assignments stream or a bucket; Check names what is missing.
func TestCheckSeesMissingStreams(t *testing.T) {
	l, closeLog := openLog(t, t.TempDir())
	defer closeLog()
	ctx := t.Context()
	require.NoError(t, l.Check(ctx), "Check on a fresh topology")
	require.NoError(t, l.js.DeleteStream(ctx, eventlog.StreamAssignments))
	require.NoError(t, l.js.DeleteKeyValue(ctx, eventlog.BucketTasks))
	require.NoError(t, l.js.DeleteKeyValue(ctx, eventlog.BucketWorkers))
	require.NoError(t, l.js.DeleteKeyValue(ctx, eventlog.BucketLeases))
	require.NoError(t, l.js.DeleteKeyValue(ctx, eventlog.BucketLive))
	require.NoError(t, l.js.DeleteKeyValue(ctx, eventlog.BucketComponents))
	err := l.Check(ctx)
	require.Error(t, err, "Check passes with the assignments stream and five buckets deleted")
	for _, want := range []string{eventlog.StreamAssignments, "KV_" + eventlog.BucketTasks, "KV_" + eventlog.BucketWorkers, "KV_" + eventlog.BucketLeases, "KV_" + eventlog.BucketLive, "KV_" + eventlog.BucketComponents} {
		assert.ErrorContains(t, err, want+" is missing")
	}
	assert.NotContains(t, err.Error(), eventlog.BucketNonces, "the nonces bucket is there")
}

// TestViewRefusesOnChangeAfterWatch: a view is subscribed before it is fed. A subscriber
// registered before Watch hears the replay; one registered after Watch started is refused
// with ErrSubscribedLate (it would have missed the replay, and raced the delivery).
func TestViewRefusesOnChangeAfterWatch(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	_, err := l.Apply(t.Context(), claim(1), nil)
	require.NoError(t, err)

	v := eventlog.NewView()
	var mu sync.Mutex
	var heard []assignment.TaskID
	v.OnChange(func(s assignment.State) { mu.Lock(); heard = append(heard, s.Task); mu.Unlock() })
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- l.Watch(ctx, v) }()
	defer func() { cancel(); require.NoError(t, <-errc) }()
	select {
	case <-v.Ready():
	case <-time.After(10 * time.Second):
		require.FailNow(t, "view not ready within 10s")
	}
	mu.Lock()
	assert.Equal(t, []assignment.TaskID{1}, heard, "the early subscriber heard the replay")
	mu.Unlock()

	require.PanicsWithError(t, eventlog.ErrSubscribedLate.Error(), func() { v.OnChange(func(assignment.State) {}) })
}

// TestViewConcurrentObserveAndRead: the components' own appends (Observe, from many
// goroutines) and their reads (Get, Live, Len) meet on one view; under -race this shows they
// do not race, and every subscriber hears every newer state exactly once.
func TestViewConcurrentObserveAndRead(t *testing.T) {
	v := eventlog.NewView()
	const subs, tasks, writers = 4, 50, 4
	var mu sync.Mutex
	heard := make(map[int]int)
	for i := range subs {
		v.OnChange(func(assignment.State) { mu.Lock(); heard[i]++; mu.Unlock() })
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			// Each writer owns its tasks, so each state is newer than the one before it.
			for i := range tasks {
				task := assignment.TaskID(w*tasks + i + 1)
				v.Observe(assignment.State{Record: assignment.Record{Task: task}, Seq: 1})
				v.Observe(assignment.State{Record: assignment.Record{Task: task}, Seq: 2})
				v.Observe(assignment.State{Record: assignment.Record{Task: task}, Seq: 1}) // older: ignored
			}
		})
	}
	for range writers {
		wg.Go(func() {
			for i := range tasks {
				_, _ = v.Get(assignment.TaskID(i + 1))
				_ = v.Live()
				_ = v.Len()
			}
		})
	}
	wg.Wait()
	require.Equal(t, writers*tasks, v.Len())
	for task := assignment.TaskID(1); task <= writers*tasks; task++ {
		s, ok := v.Get(task)
		require.True(t, ok, "task %d", task)
		require.Equal(t, uint64(2), s.Seq, "task %d keeps its newest state", task)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range subs {
		assert.Equal(t, 2*writers*tasks, heard[i], "states subscriber %d heard", i)
	}
}

// TestApplyRefusesAnInvalidClaimAtOnce: a claim the state machine refuses (here a pickup
// deadline beyond the lease) fails with the state machine's error, which the scheduler does not
// retry, not with ErrContention after sixteen rounds.
func TestApplyRefusesAnInvalidClaimAtOnce(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ev := claim(1)
	ev.Pickup = ev.Lease
	_, err := l.Apply(t.Context(), ev, nil)
	require.ErrorIs(t, err, assignment.ErrInvalidTransition)
	require.NotErrorIs(t, err, eventlog.ErrContention)
}

// TestLeaderGetTask: the read GetTask falls back to on a cluster answers as GetTask does: the
// stored bytes, and ErrNotFound for a task never stored and for one dropped (its purge marker).
func TestLeaderGetTask(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	require.NoError(t, l.PutTask(ctx, 5, []byte("sealed")))
	got, err := l.LeaderGetTask(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, "sealed", string(got))
	_, err = l.LeaderGetTask(ctx, 6)
	require.ErrorIs(t, err, assignment.ErrNotFound, "never stored")
	require.NoError(t, l.DropTask(ctx, 5))
	_, err = l.LeaderGetTask(ctx, 5)
	require.ErrorIs(t, err, assignment.ErrNotFound, "after drop")
}
