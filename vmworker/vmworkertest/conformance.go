package vmworkertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	mrand "math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// Behavior is what the environment built from a Harness.Spec does.
type Behavior int

const (
	// RunForever runs until destroyed.
	RunForever Behavior = iota + 1
	// ExitByItself runs briefly and ends normally (the guest powered off).
	ExitByItself
	// FailInside runs briefly and ends in failure.
	FailInside
	// NeverReady never becomes ready: Start must fail within the suite's timeout and leave
	// nothing behind. The harness's backend must be configured with a start timeout well
	// below Harness.Timeout.
	NeverReady
)

func (b Behavior) String() string {
	switch b {
	case RunForever:
		return "RunForever"
	case ExitByItself:
		return "ExitByItself"
	case FailInside:
		return "FailInside"
	case NeverReady:
		return "NeverReady"
	}
	return "Behavior(?)"
}

// DefaultTimeout bounds each backend call of the suite when Harness.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// Harness adapts a VM backend to the suite.
type Harness struct {
	// New returns a fresh backend instance over the same underlying state as every other
	// instance it returned; the suite calls it more than once to simulate a controller
	// restart.
	New func(t *testing.T) podworker.Backend
	// Spec returns a spec for task whose environment does behavior. The suite sets Epoch and
	// the capability token file on the result.
	Spec func(t *testing.T, task assignment.TaskID, behavior Behavior) podworker.Spec
	// Gone reports whether nothing of the destroyed environment h remains. The suite polls it
	// after each Destroy.
	Gone func(t *testing.T, h podworker.Handle) bool
	// Received returns everything the backend sent on behalf of the environments so far
	// (request bodies and queries, seed files), where the capability token must never appear.
	Received func(t *testing.T) [][]byte
	// Redeem redeems the nonce the environment h received, as its guest would, and returns
	// the token.
	Redeem func(t *testing.T, h podworker.Handle) (string, error)
	// Timeout bounds each backend call (DefaultTimeout when zero).
	Timeout time.Duration
	// FirstTask is the first task id the suite uses; zero picks a random one.
	FirstTask assignment.TaskID
	// SkipLeakCheck turns off the final check that no goroutine of the backend's package is
	// left.
	SkipLeakCheck bool
}

type suite struct {
	h    Harness
	mu   sync.Mutex
	next assignment.TaskID
	// tokens are the capability tokens the suite gave out.
	tokens [][]byte
}

// RunConformance runs the conformance suite against the VM backend h describes.
func RunConformance(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Spec == nil || h.Gone == nil || h.Received == nil || h.Redeem == nil {
		t.Fatal("vmworkertest: Harness.New, Spec, Gone, Received and Redeem are required")
	}
	if h.Timeout == 0 {
		h.Timeout = DefaultTimeout
	}
	s := &suite{h: h, next: h.FirstTask}
	if s.next == 0 {
		s.next = assignment.TaskID(1_000_000 + mrand.Int64N(1_000_000_000)*10)
	}
	t.Logf("vmworkertest: task ids from %d", s.next)
	backend := h.New(t)

	t.Run("ExitByItself", s.testEnds(ExitByItself))
	t.Run("FailInside", s.testEnds(FailInside))
	t.Run("DestroyRunning", s.testDestroyRunning)
	t.Run("DestroyIdempotent", s.testDestroyIdempotent)
	t.Run("List", s.testList)
	t.Run("Adopt", s.testAdopt)
	t.Run("WaitAdoptedEnded", s.testWaitAdoptedEnded)
	t.Run("StartTwice", s.testStartTwice)
	t.Run("StartConcurrently", s.testStartConcurrently)
	t.Run("NewEpoch", s.testNewEpoch)
	t.Run("TokenOnlyThroughNonce", s.testTokenOnlyThroughNonce)
	t.Run("MissingToken", s.testMissingToken)
	t.Run("NeverReady", s.testNeverReady)
	t.Run("TokenNeverSent", s.testTokenNeverSent)
	if !h.SkipLeakCheck {
		t.Run("NoGoroutineLeak", func(t *testing.T) { podworkertest.NoGoroutineLeak(t, backend, s.h.Timeout) })
	}
}

func (s *suite) task() assignment.TaskID {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	return s.next
}

// spec builds the spec of a new task with behavior and a fresh capability token.
func (s *suite) spec(t *testing.T, behavior Behavior) podworker.Spec {
	t.Helper()
	task := s.task()
	spec := s.h.Spec(t, task, behavior)
	if spec.Task != task {
		t.Fatalf("Harness.Spec returned task %d, want %d", spec.Task, task)
	}
	spec.Epoch = 1
	var b [24]byte
	_, _ = rand.Read(b[:])
	token := []byte("vmworkertest-token-" + hex.EncodeToString(b[:]))
	s.mu.Lock()
	s.tokens = append(s.tokens, token)
	s.mu.Unlock()
	spec.Files = map[string][]byte{podworker.TokenFile: token}
	return spec
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) start(t *testing.T, b podworker.Backend, spec podworker.Spec) podworker.Handle {
	t.Helper()
	h, err := b.Start(s.ctx(t), spec)
	if err != nil {
		t.Fatalf("Start(task %d): %v", spec.Task, err)
	}
	if h.Backend != b.Name() || h.ID == "" || h.Task != spec.Task || h.Epoch != spec.Epoch {
		t.Fatalf("Start(task %d epoch %d) = %+v: want backend %q, an id, and the spec's task and epoch",
			spec.Task, spec.Epoch, h, b.Name())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
		defer cancel()
		if err := b.Destroy(ctx, h); err != nil {
			t.Errorf("cleanup: Destroy(%s): %v", h.ID, err)
		}
	})
	return h
}

func (s *suite) wait(t *testing.T, b podworker.Backend, h podworker.Handle) podworker.Exit {
	t.Helper()
	exit, err := b.Wait(s.ctx(t), h)
	if err != nil {
		t.Fatalf("Wait(%s): %v", h.ID, err)
	}
	return exit
}

func (s *suite) destroy(t *testing.T, b podworker.Backend, h podworker.Handle) {
	t.Helper()
	if err := b.Destroy(s.ctx(t), h); err != nil {
		t.Fatalf("Destroy(%s): %v", h.ID, err)
	}
	if !poll(s.h.Timeout, func() bool { return s.h.Gone(t, h) }) {
		t.Errorf("environment %s still has something left %v after Destroy", h.ID, s.h.Timeout)
	}
}

// checkRunning checks that Wait on h blocks: the environment still runs.
func (s *suite) checkRunning(t *testing.T, b podworker.Backend, h podworker.Handle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	exit, err := b.Wait(ctx, h)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait(%s) on a running environment = %+v, %v; want context.DeadlineExceeded", h.ID, exit, err)
	}
}

type waitResult struct {
	exit podworker.Exit
	err  error
}

func (s *suite) waitAsync(t *testing.T, b podworker.Backend, h podworker.Handle) <-chan waitResult {
	ch := make(chan waitResult, 1)
	ctx := s.ctx(t)
	go func() {
		exit, err := b.Wait(ctx, h)
		ch <- waitResult{exit, err}
	}()
	return ch
}

func (s *suite) checkWaitEnded(t *testing.T, what string, ch <-chan waitResult) {
	t.Helper()
	r := <-ch // bounded by the Wait's context
	if r.err != nil && !errors.Is(r.err, podworker.ErrNotFound) {
		t.Errorf("%s: Wait during Destroy = %+v, %v; want an exit or ErrNotFound", what, r.exit, r.err)
	}
}

// listed returns the handles List reports with h's ID.
func (s *suite) listed(t *testing.T, b podworker.Backend, id string) []podworker.Handle {
	t.Helper()
	all, err := b.List(s.ctx(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var out []podworker.Handle
	for _, l := range all {
		if l.ID == id {
			out = append(out, l)
		}
	}
	return out
}

// checkListed checks that List reports exactly h, or (want false) that it stops reporting it
// within the timeout: deletion may take a moment to show.
func (s *suite) checkListed(t *testing.T, b podworker.Backend, h podworker.Handle, want bool) {
	t.Helper()
	if !want {
		if !poll(s.h.Timeout, func() bool { return len(s.listed(t, b, h.ID)) == 0 }) {
			t.Errorf("List still reports destroyed environment %s after %v", h.ID, s.h.Timeout)
		}
		return
	}
	got := s.listed(t, b, h.ID)
	switch {
	case len(got) != 1:
		t.Errorf("List reports %d environments with id %s, want 1: %+v", len(got), h.ID, got)
	case !reflect.DeepEqual(got[0], h):
		t.Errorf("List reports %+v, Start returned %+v", got[0], h)
	}
}

// checkNoneForTask checks, polling, that List reports no environment of task.
func (s *suite) checkNoneForTask(t *testing.T, b podworker.Backend, task assignment.TaskID) {
	t.Helper()
	var left []podworker.Handle
	if !poll(s.h.Timeout, func() bool {
		all, err := b.List(s.ctx(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		left = left[:0]
		for _, l := range all {
			if l.Task == task {
				left = append(left, l)
			}
		}
		return len(left) == 0
	}) {
		t.Errorf("task %d left environments: %+v", task, left)
	}
}

func (s *suite) testEnds(behavior Behavior) func(t *testing.T) {
	return func(t *testing.T) {
		b := s.h.New(t)
		h := s.start(t, b, s.spec(t, behavior))
		exit := s.wait(t, b, h)
		if exit.Reason == "" {
			t.Errorf("exit = %+v: want a reason", exit)
		}
		if again := s.wait(t, b, h); !reflect.DeepEqual(again, exit) {
			t.Errorf("second Wait = %+v, first %+v", again, exit)
		}
		s.destroy(t, b, h)
	}
}

func (s *suite) testDestroyRunning(t *testing.T) {
	b := s.h.New(t)
	h := s.start(t, b, s.spec(t, RunForever))
	s.checkRunning(t, b, h)
	waited := s.waitAsync(t, b, h)
	s.destroy(t, b, h)
	s.checkWaitEnded(t, "same instance", waited)
	if exit, err := b.Wait(s.ctx(t), h); !errors.Is(err, podworker.ErrNotFound) {
		t.Errorf("Wait after Destroy = %+v, %v; want ErrNotFound", exit, err)
	}
}

func (s *suite) testDestroyIdempotent(t *testing.T) {
	b := s.h.New(t)
	h := s.start(t, b, s.spec(t, RunForever))
	s.destroy(t, b, h)
	if err := b.Destroy(s.ctx(t), h); err != nil {
		t.Errorf("second Destroy = %v, want nil", err)
	}
	if err := s.h.New(t).Destroy(s.ctx(t), h); err != nil {
		t.Errorf("Destroy by another instance after Destroy = %v, want nil", err)
	}
	unknown := podworker.Handle{Backend: b.Name(), ID: "dynrunner-conformance-unknown", Task: s.task(), Epoch: 1}
	if err := b.Destroy(s.ctx(t), unknown); err != nil {
		t.Errorf("Destroy of an unknown handle = %v, want nil", err)
	}
}

func (s *suite) testList(t *testing.T) {
	b := s.h.New(t)
	h1 := s.start(t, b, s.spec(t, RunForever))
	h2 := s.start(t, b, s.spec(t, RunForever))
	s.checkListed(t, b, h1, true)
	s.checkListed(t, b, h2, true)
	s.destroy(t, b, h1)
	s.checkListed(t, b, h1, false)
	s.checkListed(t, b, h2, true)
	s.destroy(t, b, h2)
	s.checkListed(t, b, h2, false)
}

func (s *suite) testAdopt(t *testing.T) {
	b1 := s.h.New(t)
	spec := s.spec(t, RunForever)
	h := s.start(t, b1, spec)

	b2 := s.h.New(t) // the controller restarted
	s.checkListed(t, b2, h, true)
	s.checkRunning(t, b2, h)
	again, err := b2.Start(s.ctx(t), spec)
	if err != nil {
		t.Fatalf("Start on a second instance: %v", err)
	}
	if !reflect.DeepEqual(again, h) {
		t.Errorf("Start on a second instance = %+v, want the running %+v", again, h)
	}
	waited1 := s.waitAsync(t, b1, h)
	waited2 := s.waitAsync(t, b2, h)
	s.destroy(t, b2, h)
	s.checkWaitEnded(t, "starting instance", waited1)
	s.checkWaitEnded(t, "adopting instance", waited2)
	s.checkListed(t, b1, h, false)
	if err := b1.Destroy(s.ctx(t), h); err != nil {
		t.Errorf("Destroy by the starting instance after the adopting one: %v", err)
	}
}

func (s *suite) testWaitAdoptedEnded(t *testing.T) {
	b1 := s.h.New(t)
	h := s.start(t, b1, s.spec(t, ExitByItself))
	first := s.wait(t, b1, h)
	b2 := s.h.New(t)
	if got := s.wait(t, b2, h); got.Reason == "" {
		t.Errorf("Wait on the adopting instance = %+v (first instance: %+v); want a reason", got, first)
	}
	s.destroy(t, b2, h)
}

func (s *suite) testStartTwice(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, RunForever)
	h := s.start(t, b, spec)
	again, err := b.Start(s.ctx(t), spec)
	if err != nil {
		t.Fatalf("second Start: %v", err)
	}
	if !reflect.DeepEqual(again, h) {
		t.Errorf("second Start = %+v, want the running %+v", again, h)
	}
	s.checkListed(t, b, h, true)
	s.checkRunning(t, b, h)
	s.destroy(t, b, h)
}

func (s *suite) testStartConcurrently(t *testing.T) {
	spec := s.spec(t, RunForever)
	const n = 4
	handles := make([]podworker.Handle, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ctx := s.ctx(t)
	for i := range n {
		b := s.h.New(t)
		wg.Go(func() { handles[i], errs[i] = b.Start(ctx, spec) })
	}
	wg.Wait()
	b := s.h.New(t)
	for i := range n {
		if errs[i] != nil {
			t.Errorf("Start %d: %v", i, errs[i])
			continue
		}
		h := handles[i]
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		if !reflect.DeepEqual(h, handles[0]) {
			t.Errorf("concurrent Start %d = %+v, Start 0 = %+v", i, h, handles[0])
		}
	}
	if t.Failed() {
		return
	}
	s.checkListed(t, b, handles[0], true)
	s.checkRunning(t, b, handles[0])
	// The losers' environments are gone: only the winner is left for the task.
	if !poll(s.h.Timeout, func() bool {
		all, err := b.List(s.ctx(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		count := 0
		for _, l := range all {
			if l.Task == spec.Task {
				count++
			}
		}
		return count == 1
	}) {
		t.Errorf("concurrent starts of task %d left more than one environment", spec.Task)
	}
	s.destroy(t, b, handles[0])
}

func (s *suite) testNewEpoch(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, RunForever)
	h1 := s.start(t, b, spec)
	spec.Epoch = 2
	h2 := s.start(t, b, spec)
	if h2.ID == h1.ID || h2.Epoch != 2 {
		t.Fatalf("Start of epoch 2 = %+v, epoch 1 = %+v: want a new environment", h2, h1)
	}
	s.checkListed(t, b, h1, true)
	s.checkListed(t, b, h2, true)
	s.destroy(t, b, h1)
	s.destroy(t, b, h2)
}

func (s *suite) testTokenOnlyThroughNonce(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, RunForever)
	h := s.start(t, b, spec)
	token, err := s.h.Redeem(t, h)
	if err != nil {
		t.Fatalf("redeem the environment's nonce: %v", err)
	}
	if token != string(spec.Files[podworker.TokenFile]) {
		t.Errorf("the nonce redeemed a token of %d bytes, not the spec's", len(token))
	}
	if _, err := s.h.Redeem(t, h); err == nil {
		t.Errorf("the nonce redeemed twice")
	}
	s.destroy(t, b, h)
}

func (s *suite) testMissingToken(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, RunForever)
	spec.Files = nil
	if h, err := b.Start(s.ctx(t), spec); err == nil {
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		t.Fatalf("Start without a capability token = %+v, want an error", h)
	}
	s.checkNoneForTask(t, b, spec.Task)
}

func (s *suite) testNeverReady(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, NeverReady)
	h, err := b.Start(s.ctx(t), spec)
	if err == nil {
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		t.Fatalf("Start of an environment that never becomes ready = %+v, want an error", h)
	}
	t.Logf("Start error: %v", err)
	s.checkNoneForTask(t, b, spec.Task)
}

// testTokenNeverSent runs last: no token the suite gave out appears in anything the backend
// sent.
func (s *suite) testTokenNeverSent(t *testing.T) {
	s.mu.Lock()
	tokens := s.tokens
	s.mu.Unlock()
	received := s.h.Received(t)
	if len(received) == 0 {
		t.Fatal("Harness.Received returned nothing: it must return what the backend sent")
	}
	for _, r := range received {
		for _, tok := range tokens {
			if bytes.Contains(r, tok) {
				t.Fatalf("a capability token reached the environment side: %q", r)
			}
		}
	}
}

// poll calls cond until it is true or timeout passed, with growing pauses.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 200*time.Millisecond)
	}
}
