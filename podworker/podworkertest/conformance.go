package podworkertest

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

// Behavior is what the environment built from a Harness.Spec does.
type Behavior int

const (
	// RunForever runs until it is killed; SIGTERM (or the backend's equivalent) ends it.
	RunForever Behavior = iota + 1
	// ExitZero exits with code 0 at once.
	ExitZero
	// ExitNonZero exits with code NonZeroExitCode at once.
	ExitNonZero
	// CheckSecrets exits with code 0 if the directory named by DYNRUNNER_SECRETS_DIR holds a
	// file SecretName with mode 0600 and content SecretContent, and with a non-zero code if not.
	// The suite sets Spec.Files itself.
	CheckSecrets
	// WriteFilesAndExit writes files into its working directory, HOME and TMPDIR, among them a
	// read-only tree (directories 0555, files 0444, as Go's module cache), then exits with 0.
	WriteFilesAndExit
)

func (b Behavior) String() string {
	switch b {
	case RunForever:
		return "RunForever"
	case ExitZero:
		return "ExitZero"
	case ExitNonZero:
		return "ExitNonZero"
	case CheckSecrets:
		return "CheckSecrets"
	case WriteFilesAndExit:
		return "WriteFilesAndExit"
	}
	return "Behavior(?)"
}

// The exit code of ExitNonZero and the secret file of CheckSecrets.
const (
	NonZeroExitCode = 3
	SecretName      = "capability-token"
	SecretContent   = "conformance-secret\n"
)

// DefaultTimeout bounds each backend call of the suite when Harness.Timeout is zero.
const DefaultTimeout = 60 * time.Second

// Harness adapts a backend to the suite.
type Harness struct {
	// New returns a fresh backend instance over the same underlying state as every other
	// instance it returned (the same root directory, Docker engine or namespace); the suite
	// calls it more than once to simulate a controller restart. It registers its own cleanup.
	New func(t *testing.T) podworker.Backend
	// Spec returns a spec for task whose environment does behavior. The suite sets Epoch (and
	// Files, for CheckSecrets) on the result.
	Spec func(t *testing.T, task assignment.TaskID, behavior Behavior) podworker.Spec
	// Gone, if set, reports whether nothing of the destroyed environment h remains (for local:
	// its directory is gone and no process of it runs). The suite polls it after each Destroy.
	Gone func(t *testing.T, h podworker.Handle) bool
	// KnownExitCodes says Wait reports real exit codes for environments the same instance
	// started; otherwise the suite also accepts -1.
	KnownExitCodes bool
	// Timeout bounds each backend call (DefaultTimeout when zero).
	Timeout time.Duration
	// FirstTask is the first task id the suite uses; zero picks a random one, so runs against
	// shared state (a cluster) do not meet each other's leftovers.
	FirstTask assignment.TaskID
	// SkipLeakCheck turns off the final check that no goroutine of the backend's package is
	// left once every environment is destroyed.
	SkipLeakCheck bool
}

// suite is one run of RunConformance.
type suite struct {
	h    Harness
	mu   sync.Mutex
	next assignment.TaskID
}

// RunConformance runs the conformance suite against the backend h describes.
func RunConformance(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Spec == nil {
		t.Fatal("podworkertest: Harness.New and Harness.Spec are required")
	}
	if h.Timeout == 0 {
		h.Timeout = DefaultTimeout
	}
	s := &suite{h: h, next: h.FirstTask}
	if s.next == 0 {
		s.next = assignment.TaskID(1_000_000 + rand.Int64N(1_000_000_000)*10)
	}
	t.Logf("podworkertest: task ids from %d", s.next)
	pkg := backendPackage(h.New(t))

	t.Run("ExitZero", s.testExit(ExitZero, 0))
	t.Run("ExitNonZero", s.testExit(ExitNonZero, NonZeroExitCode))
	t.Run("DestroyRunning", s.testDestroyRunning)
	t.Run("DestroyIdempotent", s.testDestroyIdempotent)
	t.Run("List", s.testList)
	t.Run("Adopt", s.testAdopt)
	t.Run("WaitAdoptedExited", s.testWaitAdoptedExited)
	t.Run("StartTwice", s.testStartTwice)
	t.Run("StartConcurrently", s.testStartConcurrently)
	t.Run("Secrets", s.testSecrets)
	t.Run("RejectsUnsafeSecretName", s.testRejectsUnsafeSecretName)
	t.Run("WriteFiles", s.testWriteFiles)
	if !h.SkipLeakCheck && pkg != "" {
		t.Run("NoGoroutineLeak", func(t *testing.T) { checkNoGoroutines(t, pkg, s.h.Timeout) })
	}
}

// task returns a task id no other case of this run uses.
func (s *suite) task() assignment.TaskID {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	return s.next
}

// spec builds the spec of a new task with behavior.
func (s *suite) spec(t *testing.T, behavior Behavior) podworker.Spec {
	t.Helper()
	task := s.task()
	spec := s.h.Spec(t, task, behavior)
	if spec.Task != task {
		t.Fatalf("Harness.Spec returned task %d, want %d", spec.Task, task)
	}
	spec.Epoch = 1
	return spec
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// start starts spec on b, checks the handle and registers a Destroy for cleanup.
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

// wait waits for h with the suite's timeout and fails on error.
func (s *suite) wait(t *testing.T, b podworker.Backend, h podworker.Handle) podworker.Exit {
	t.Helper()
	exit, err := b.Wait(s.ctx(t), h)
	if err != nil {
		t.Fatalf("Wait(%s): %v", h.ID, err)
	}
	return exit
}

// checkCode checks an exit code: want, or -1 when the backend may not know it.
func (s *suite) checkCode(t *testing.T, exit podworker.Exit, want int, mayBeUnknown bool) {
	t.Helper()
	if exit.Code == want || (exit.Code == -1 && (mayBeUnknown || !s.h.KnownExitCodes)) {
		return
	}
	t.Errorf("exit = %+v, want code %d", exit, want)
}

// destroy destroys h and checks that nothing of it remains.
func (s *suite) destroy(t *testing.T, b podworker.Backend, h podworker.Handle) {
	t.Helper()
	if err := b.Destroy(s.ctx(t), h); err != nil {
		t.Fatalf("Destroy(%s): %v", h.ID, err)
	}
	s.checkGone(t, h)
}

func (s *suite) checkGone(t *testing.T, h podworker.Handle) {
	t.Helper()
	if s.h.Gone == nil {
		return
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

// waitResult is the outcome of a Wait run in the background.
type waitResult struct {
	exit podworker.Exit
	err  error
}

// waitAsync runs Wait in a goroutine; the channel delivers its result.
func (s *suite) waitAsync(t *testing.T, b podworker.Backend, h podworker.Handle) <-chan waitResult {
	ch := make(chan waitResult, 1)
	ctx := s.ctx(t)
	go func() {
		exit, err := b.Wait(ctx, h)
		ch <- waitResult{exit, err}
	}()
	return ch
}

// checkWaitEnded checks that a background Wait racing with Destroy returned: with an Exit, or
// with ErrNotFound when it only looked after the environment was gone.
func (s *suite) checkWaitEnded(t *testing.T, what string, ch <-chan waitResult) {
	t.Helper()
	r := <-ch // bounded by the Wait's context
	if r.err != nil && !errors.Is(r.err, podworker.ErrNotFound) {
		t.Errorf("%s: Wait during Destroy = %+v, %v; want an exit or ErrNotFound", what, r.exit, r.err)
	}
}

func (s *suite) testExit(behavior Behavior, code int) func(t *testing.T) {
	return func(t *testing.T) {
		b := s.h.New(t)
		h := s.start(t, b, s.spec(t, behavior))
		exit := s.wait(t, b, h)
		s.checkCode(t, exit, code, false)
		// Waiting again gives the same answer while the environment exists.
		if again := s.wait(t, b, h); again.Code != exit.Code {
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

// listed returns the handles of List with h's ID.
func (s *suite) listed(t *testing.T, b podworker.Backend, h podworker.Handle) []podworker.Handle {
	t.Helper()
	all, err := b.List(s.ctx(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var out []podworker.Handle
	for _, l := range all {
		if l.ID == h.ID {
			out = append(out, l)
		}
	}
	return out
}

// checkListed checks that List reports exactly h, or nothing when want is false.
func (s *suite) checkListed(t *testing.T, b podworker.Backend, h podworker.Handle, want bool) {
	t.Helper()
	got := s.listed(t, b, h)
	switch {
	case !want && len(got) != 0:
		t.Errorf("List reports destroyed environment %s: %+v", h.ID, got)
	case want && len(got) != 1:
		t.Errorf("List reports %d environments with id %s, want 1: %+v", len(got), h.ID, got)
	case want && !reflect.DeepEqual(got[0], h):
		t.Errorf("List reports %+v, Start returned %+v", got[0], h)
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
	// A retried dispatch on the new instance finds the running environment.
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

func (s *suite) testWaitAdoptedExited(t *testing.T) {
	b1 := s.h.New(t)
	h := s.start(t, b1, s.spec(t, ExitNonZero))
	s.checkCode(t, s.wait(t, b1, h), NonZeroExitCode, false)
	b2 := s.h.New(t)
	s.checkCode(t, s.wait(t, b2, h), NonZeroExitCode, true)
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
	s.destroy(t, b, handles[0])
}

func (s *suite) testSecrets(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, CheckSecrets)
	spec.Files = map[string][]byte{SecretName: []byte(SecretContent)}
	h := s.start(t, b, spec)
	s.checkCode(t, s.wait(t, b, h), 0, false)
	s.destroy(t, b, h)
}

func (s *suite) testRejectsUnsafeSecretName(t *testing.T) {
	b := s.h.New(t)
	for _, name := range []string{"../escape", "a/b", "..", "", "/abs"} {
		spec := s.spec(t, RunForever)
		spec.Files = map[string][]byte{name: []byte("x")}
		h, err := b.Start(s.ctx(t), spec)
		if err == nil {
			t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
			t.Errorf("Start with secret file %q succeeded, want an error", name)
			continue
		}
		all, err := b.List(s.ctx(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, l := range all {
			if l.Task == spec.Task {
				t.Errorf("rejected Start of task %d left %+v", spec.Task, l)
			}
		}
	}
}

func (s *suite) testWriteFiles(t *testing.T) {
	b := s.h.New(t)
	h := s.start(t, b, s.spec(t, WriteFilesAndExit))
	s.checkCode(t, s.wait(t, b, h), 0, false)
	s.destroy(t, b, h)
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
