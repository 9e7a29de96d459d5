package eventlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

func openLog(t *testing.T, dir string) (*eventlog.Log, func()) {
	t.Helper()
	c, err := natsconn.Connect(natsconn.Config{StoreDir: dir, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(c.NC)
	if err != nil {
		t.Fatal(err)
	}
	elCfg := eventlog.DefaultConfig()
	elCfg.Key = []byte("0123456789abcdef0123456789abcdef")
	l, err := eventlog.Open(t.Context(), js, elCfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, c.Close
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
	if err != nil {
		t.Fatal(err)
	}
	epoch := s.Epoch()
	if got, want := uint64(epoch), s.Seq; got != want || epoch == 0 {
		t.Fatalf("epoch = %d, want the claim's sequence %d", got, want)
	}
	if _, err := l.Apply(ctx, claim(7), nil); !errors.Is(err, assignment.ErrExists) {
		t.Fatalf("second claim: err = %v, want ErrExists", err)
	}
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
		if err != nil {
			t.Fatalf("%s: %v", ev.Transition, err)
		}
		if s.Epoch() != epoch {
			t.Fatalf("%s changed the epoch to %d", ev.Transition, s.Epoch())
		}
	}
	got, err := l.Get(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	if got.Phase != assignment.Completed || got.Result != "success" || got.Seq != s.Seq {
		t.Fatalf("state = %+v", got)
	}

	// A report from a stale epoch is rejected.
	_, err = l.Apply(ctx, claim(8), nil)
	if err != nil {
		t.Fatal(err)
	}
	stale := assignment.Event{Transition: assignment.Dispatched, Task: 8, Epoch: epoch, At: t0}
	if _, err := l.Apply(ctx, stale, nil); !errors.Is(err, assignment.ErrStaleEpoch) {
		t.Fatalf("stale epoch: err = %v, want ErrStaleEpoch", err)
	}
}

// TestRedeemOnce races many redemptions of one token: exactly one wins, decided by JetStream.
func TestRedeemOnce(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	s, err := l.Apply(ctx, claim(9), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := s.Epoch()
	if _, err := l.Apply(ctx, assignment.Event{Transition: assignment.Started, Task: 9, Epoch: e, At: t0, Handle: []byte(`{}`), TokenID: "tok"}, nil); err != nil {
		t.Fatal(err)
	}
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
		switch {
		case err == nil:
			wins++
		case errors.Is(err, assignment.ErrTokenRedeemed):
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d redemptions won, want exactly 1", wins)
	}
}

func TestStaleHintIsReread(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	s, err := l.Apply(ctx, claim(3), nil)
	if err != nil {
		t.Fatal(err)
	}
	hint := s
	if _, err := l.Apply(ctx, assignment.Event{Transition: assignment.Dispatched, Task: 3, Epoch: s.Epoch(), At: t0}, nil); err != nil {
		t.Fatal(err)
	}
	// The hint is one append behind; the CAS fails, Apply re-reads and succeeds.
	got, err := l.Apply(ctx, assignment.Event{Transition: assignment.Started, Task: 3, Epoch: s.Epoch(), At: t0, Handle: []byte(`{}`), TokenID: "t"}, &hint)
	if err != nil {
		t.Fatal(err)
	}
	if got.Phase != assignment.Started {
		t.Fatalf("phase = %s", got.Phase)
	}
}

func TestViewSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	l, done := openLog(t, dir)
	for task := assignment.TaskID(1); task <= 5; task++ {
		if _, err := l.Apply(t.Context(), claim(task), nil); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := l.Get(t.Context(), 2)
	if _, err := l.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: 2, Epoch: s.Epoch(), At: t0, Reason: "x"}, nil); err != nil {
		t.Fatal(err)
	}
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
		t.Fatal("view not ready within 10s")
	}
	if got := v.Len(); got != 5 {
		t.Fatalf("view holds %d assignments, want 5", got)
	}
	if s, ok := v.Get(2); !ok || s.Phase != assignment.Failed {
		t.Fatalf("task 2 = %+v, want failed", s)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Watch returned %v on cancellation, want nil", err)
	}
}

func TestDispatchDeduplicates(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	for range 3 {
		if err := l.Dispatch(ctx, assignment.BackendPod, 4, 11); err != nil {
			t.Fatal(err)
		}
	}
	st, err := l.JetStream().Stream(ctx, eventlog.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("dispatch stream holds %d messages, want 1", info.State.Msgs)
	}
}

func TestDropTaskRemovesSecretMaterial(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	if err := l.PutTask(ctx, 5, []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	if got, err := l.GetTask(ctx, 5); err != nil || string(got) != "sealed" {
		t.Fatalf("GetTask = %q, %v", got, err)
	}
	if err := l.DropTask(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := l.GetTask(ctx, 5); !errors.Is(err, assignment.ErrNotFound) {
		t.Fatalf("after drop: err = %v, want ErrNotFound", err)
	}
	st, _ := l.JetStream().Stream(ctx, "KV_"+eventlog.BucketTasks)
	if _, err := st.GetMsg(ctx, 1); err == nil {
		t.Fatal("the sealed task's message is still in the stream")
	}
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
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
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
		if m.Task <= 0 || m.Epoch == 0 {
			t.Fatalf("accepted %+v", m)
		}
		// What is accepted round-trips: the scheduler's encoding of it parses to the same.
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := eventlog.ParseDispatchBody(again); err != nil || back != m {
			t.Fatalf("round trip of %+v: %+v, %v", m, back, err)
		}
	})
}

// TestCheckSeesMissingStreams: an operator (or an attacker with the NATS password) deletes the
// assignments stream or the tasks bucket; Check names what is missing.
func TestCheckSeesMissingStreams(t *testing.T) {
	l, closeLog := openLog(t, t.TempDir())
	defer closeLog()
	ctx := t.Context()
	if err := l.Check(ctx); err != nil {
		t.Fatalf("Check on a fresh topology: %v", err)
	}
	js := l.JetStream()
	if err := js.DeleteStream(ctx, eventlog.StreamAssignments); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, eventlog.BucketTasks); err != nil {
		t.Fatal(err)
	}
	err := l.Check(ctx)
	if err == nil {
		t.Fatal("Check passes with the assignments stream and the tasks bucket deleted")
	}
	for _, want := range []string{eventlog.StreamAssignments + " is missing", "KV_" + eventlog.BucketTasks + " is missing"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check's error %q does not say %q", err, want)
		}
	}
}

// TestViewOnChangeWhileWatching: components register with a view the controller already
// watches; under -race this shows the registration does not race with the delivery.
func TestViewOnChangeWhileWatching(t *testing.T) {
	v := eventlog.NewView()
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := 0
	wg.Go(func() {
		for i := range 200 {
			v.Observe(assignment.State{Record: assignment.Record{Task: assignment.TaskID(i + 1)}, Seq: uint64(i + 1)})
		}
	})
	for range 20 {
		v.OnChange(func(assignment.State) { mu.Lock(); seen++; mu.Unlock() })
	}
	wg.Wait()
	v.Observe(assignment.State{Record: assignment.Record{Task: 1000}, Seq: 1000})
	mu.Lock()
	defer mu.Unlock()
	if seen < 20 {
		t.Fatalf("%d calls, want at least one per subscriber for the last state", seen)
	}
}
