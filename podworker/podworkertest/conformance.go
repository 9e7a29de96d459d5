package podworkertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

// Behavior is what the environment built from a Harness.Spec does.
type Behavior int

const (
	// RunForever runs until it is destroyed; SIGTERM (or the backend's equivalent) ends it.
	RunForever Behavior = iota + 1
	// ExitZero ends by itself at once, successfully: exit code 0 (a guest that powered off).
	ExitZero
	// ExitNonZero ends by itself at once in failure, with exit code NonZeroExitCode when the
	// backend reports codes (Harness.KnownExitCodes).
	ExitNonZero
	// CheckSecrets exits with code 0 if the directory named by DYNRUNNER_SECRETS_DIR holds a
	// file SecretName with mode 0600 and content SecretContent, and with a non-zero code if not.
	// The suite sets Spec.Files itself.
	CheckSecrets
	// WriteFilesAndExit writes files into its working directory, HOME and TMPDIR, among them a
	// read-only tree (directories 0555, files 0444, as Go's module cache), then exits with 0.
	WriteFilesAndExit
	// NeverReady never becomes ready: Start must fail within the suite's timeout and leave
	// nothing behind. The harness's backend must be configured with a start timeout well
	// below Harness.Timeout.
	NeverReady
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
	case NeverReady:
		return "NeverReady"
	}
	return "Behavior(?)"
}

// The exit code of ExitNonZero, the secret file of CheckSecrets and the prefix of the
// capability tokens the suite gives every spec.
const (
	NonZeroExitCode = 3
	SecretName      = "capability-token"
	SecretContent   = "conformance-secret\n"
	TokenPrefix     = "podworkertest-token-"
)

// DefaultTimeout bounds each backend call of the suite when Harness.Timeout is zero.
const DefaultTimeout = 60 * time.Second

// The checks of the suite, one subtest each. A harness names those its backend cannot do in
// Harness.Without, each with the reason.
const (
	CheckExitZero                = "ExitZero"
	CheckExitNonZero             = "ExitNonZero"
	CheckDestroyRunning          = "DestroyRunning"
	CheckDestroyIdempotent       = "DestroyIdempotent"
	CheckList                    = "List"
	CheckAdopt                   = "Adopt"
	CheckWaitAdoptedExited       = "WaitAdoptedExited"
	CheckStartTwice              = "StartTwice"
	CheckStartConcurrently       = "StartConcurrently"
	CheckNewEpoch                = "NewEpoch"
	CheckSecretFiles             = "Secrets"
	CheckRejectsUnsafeSecretName = "RejectsUnsafeSecretName"
	CheckWriteFiles              = "WriteFiles"
	CheckNeverReady              = "NeverReady"
	CheckDiagnose                = "Diagnose"
	CheckTokenOnlyThroughNonce   = "TokenOnlyThroughNonce"
	CheckMissingToken            = "MissingToken"
	CheckTokenNeverSent          = "TokenNeverSent"
	CheckNotifyCancelled         = "NotifyCancelled"
	CheckNoGoroutineLeak         = "NoGoroutineLeak"
)

// checks lists every check in the order the suite runs them. TokenNeverSent and
// NoGoroutineLeak look back at everything before them and run last.
var checks = []string{
	CheckExitZero, CheckExitNonZero, CheckDestroyRunning, CheckDestroyIdempotent, CheckList,
	CheckAdopt, CheckWaitAdoptedExited, CheckStartTwice, CheckStartConcurrently, CheckNewEpoch,
	CheckSecretFiles, CheckRejectsUnsafeSecretName, CheckWriteFiles, CheckNeverReady,
	CheckDiagnose, CheckTokenOnlyThroughNonce, CheckMissingToken, CheckTokenNeverSent,
	CheckNotifyCancelled, CheckNoGoroutineLeak,
}

// Harness adapts a backend to the suite.
type Harness struct {
	// New returns a fresh backend instance over the same underlying state as every other
	// instance it returned (the same root directory, Docker engine, namespace or server); the
	// suite calls it more than once to simulate a controller restart. It registers its own
	// cleanup.
	New func(t *testing.T) podworker.Backend
	// Spec returns a spec for task whose environment does behavior. The suite sets Epoch and
	// Files (a capability token in podworker.TokenFile, and the secret of CheckSecrets) on the
	// result.
	Spec func(t *testing.T, task assignment.TaskID, behavior Behavior) podworker.Spec
	// Gone, if set, reports whether nothing of the destroyed environment h remains (for local:
	// its directory is gone and no process of it runs). The suite polls it after each Destroy.
	Gone func(t *testing.T, h podworker.Handle) bool
	// KnownExitCodes says Wait reports real exit codes for environments the same instance
	// started; otherwise the suite also accepts -1.
	KnownExitCodes bool
	// ListLags says List may go on reporting a destroyed environment for a while (a remote
	// API that deletes asynchronously); the suite then polls until it stops.
	ListLags bool
	// DiagnosePrefix, if set, is how the line Diagnose returns for an ExitNonZero environment
	// starts (podworker.LauncherErrorPrefix for the launcher); when empty the suite accepts no
	// line or one starting with either prefix.
	DiagnosePrefix string
	// Nonce is set for backends that keep the capability token in the controller and give the
	// environment a single-use nonce for it (the VM backends).
	Nonce *NonceHarness
	// Without names the checks (Check*) the backend cannot do, each with the reason, which
	// the suite reports as the subtest's skip.
	Without map[string]string
	// Timeout bounds each backend call (DefaultTimeout when zero).
	Timeout time.Duration
	// FirstTask is the first task id the suite uses; zero picks a random one, so runs against
	// shared state (a cluster) do not meet each other's leftovers.
	FirstTask assignment.TaskID
}

// NonceHarness adapts the nonce of a backend that redeems tokens through one.
type NonceHarness struct {
	// Redeem redeems the nonce the environment h received, as its guest would, and returns
	// the token.
	Redeem func(t *testing.T, h podworker.Handle) (string, error)
	// Received, if set, returns everything the backend sent on behalf of the environments so
	// far (request bodies and queries, launcher environments, seed files), where no capability
	// token may appear.
	Received func(t *testing.T) [][]byte
}

// suite is one run of RunConformance.
type suite struct {
	h    Harness
	mu   sync.Mutex
	next assignment.TaskID
	// tokens are the capability tokens the suite gave out.
	tokens [][]byte
}

// RunConformance runs the conformance suite against the backend h describes: every check
// except those h.Without names.
func RunConformance(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.New, "podworkertest: Harness.New is required")
	require.NotNil(t, h.Spec, "podworkertest: Harness.Spec is required")
	for name, reason := range h.Without {
		require.Contains(t, checks, name, "podworkertest: Harness.Without names an unknown check")
		require.NotEmpty(t, reason, "podworkertest: Harness.Without[%s] needs the reason", name)
	}
	if h.Nonce != nil {
		require.NotNil(t, h.Nonce.Redeem, "podworkertest: NonceHarness.Redeem is required")
	}
	if h.Timeout == 0 {
		h.Timeout = DefaultTimeout
	}
	s := &suite{h: h, next: h.FirstTask}
	if s.next == 0 {
		s.next = assignment.TaskID(1_000_000 + mrand.Int64N(1_000_000_000)*10)
	}
	t.Logf("podworkertest: task ids from %d", s.next)
	backend := h.New(t)

	run := map[string]func(*testing.T){
		CheckExitZero:                s.testExit(ExitZero, 0),
		CheckExitNonZero:             s.testExit(ExitNonZero, NonZeroExitCode),
		CheckDestroyRunning:          s.testDestroyRunning,
		CheckDestroyIdempotent:       s.testDestroyIdempotent,
		CheckList:                    s.testList,
		CheckAdopt:                   s.testAdopt,
		CheckWaitAdoptedExited:       s.testWaitAdoptedExited,
		CheckStartTwice:              s.testStartTwice,
		CheckStartConcurrently:       s.testStartConcurrently,
		CheckNewEpoch:                s.testNewEpoch,
		CheckSecretFiles:             s.testSecrets,
		CheckRejectsUnsafeSecretName: s.testRejectsUnsafeSecretName,
		CheckWriteFiles:              s.testWriteFiles,
		CheckNeverReady:              s.testNeverReady,
		CheckDiagnose:                s.testDiagnose,
		CheckTokenOnlyThroughNonce:   s.needsNonce(s.testTokenOnlyThroughNonce),
		CheckMissingToken:            s.needsNonce(s.testMissingToken),
		CheckTokenNeverSent:          s.needsNonce(s.testTokenNeverSent),
		CheckNotifyCancelled:         s.testNotifyCancelled,
		CheckNoGoroutineLeak: func(t *testing.T) {
			pkg := backendPackage(backend)
			require.NotEmpty(t, pkg, "the backend's type has no package")
			checkNoGoroutines(t, pkg, s.h.Timeout)
		},
	}
	for _, name := range checks {
		if reason, ok := h.Without[name]; ok {
			t.Run(name, func(t *testing.T) { t.Skipf("%s: not supported: %s", backend.Name(), reason) })
			continue
		}
		t.Run(name, run[name])
	}
}

// needsNonce runs check only for backends with a NonceHarness; the others receive the token
// as a secret file, which the Secrets check covers.
func (s *suite) needsNonce(check func(*testing.T)) func(*testing.T) {
	return func(t *testing.T) {
		if s.h.Nonce == nil {
			t.Skip("not supported: the backend gives the environment its capability token as a secret file (see Secrets); it redeems no nonce")
		}
		check(t)
	}
}

// task returns a task id no other case of this run uses.
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
	require.Equal(t, task, spec.Task, "Harness.Spec returned another task")
	spec.Epoch = 1
	var b [24]byte
	_, _ = rand.Read(b[:])
	token := []byte(TokenPrefix + hex.EncodeToString(b[:]))
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

// start starts spec on b, checks the handle and registers a Destroy for cleanup.
func (s *suite) start(t *testing.T, b podworker.Backend, spec podworker.Spec) podworker.Handle {
	t.Helper()
	h, err := b.Start(s.ctx(t), spec)
	require.NoError(t, err, "Start(task %d)", spec.Task)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
		defer cancel()
		assert.NoError(t, b.Destroy(ctx, h), "cleanup: Destroy(%s)", h.ID)
	})
	want := podworker.Handle{Backend: b.Name(), ID: h.ID, Task: spec.Task, Epoch: spec.Epoch, Data: h.Data}
	require.Equal(t, want, h, "Start(task %d epoch %d): want backend %q and the spec's task and epoch", spec.Task, spec.Epoch, b.Name())
	require.NotEmpty(t, h.ID, "Start(task %d) returned a handle without an id", spec.Task)
	return h
}

// wait waits for h with the suite's timeout and fails on error. A backend that is a
// podworker.Notifier is waited on through Notify, which must agree with Wait.
func (s *suite) wait(t *testing.T, b podworker.Backend, h podworker.Handle) podworker.Exit {
	t.Helper()
	r := <-s.waitAsync(t, b, h) // bounded by the suite's context
	require.NoError(t, r.Err, "Wait(%s)", h.ID)
	return r.Exit
}

// checkCode checks an exit code, want or -1 when the backend may not know it, and that the
// exit says why.
func (s *suite) checkCode(t *testing.T, exit podworker.Exit, want int, mayBeUnknown bool) {
	t.Helper()
	assert.NotEmpty(t, exit.Reason, "exit %+v says no reason", exit)
	if exit.Code == -1 && (mayBeUnknown || !s.h.KnownExitCodes) {
		return
	}
	assert.Equal(t, want, exit.Code, "exit = %+v", exit)
}

// destroy destroys h and checks that nothing of it remains.
func (s *suite) destroy(t *testing.T, b podworker.Backend, h podworker.Handle) {
	t.Helper()
	require.NoError(t, b.Destroy(s.ctx(t), h), "Destroy(%s)", h.ID)
	s.checkGone(t, h)
}

func (s *suite) checkGone(t *testing.T, h podworker.Handle) {
	t.Helper()
	if s.h.Gone == nil {
		return
	}
	assert.True(t, poll(s.h.Timeout, func() bool { return s.h.Gone(t, h) }),
		"environment %s still has something left %v after Destroy", h.ID, s.h.Timeout)
}

// checkRunning checks that Wait on h blocks: the environment still runs.
func (s *suite) checkRunning(t *testing.T, b podworker.Backend, h podworker.Handle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	exit, err := b.Wait(ctx, h)
	require.ErrorIs(t, err, context.DeadlineExceeded, "Wait(%s) on a running environment = %+v", h.ID, exit)
}

// waitAsync waits for h in the background, as the worker does (podworker.Await: Notify when
// the backend is a Notifier, else Wait); the channel delivers the result. It fails the test if
// the result comes more than once.
func (s *suite) waitAsync(t *testing.T, b podworker.Backend, h podworker.Handle) <-chan Ended {
	return Ends(t, h, func(ended func(podworker.Exit, error)) {
		stop := podworker.Await(b, h, ended)
		ctx := s.ctx(t)
		context.AfterFunc(ctx, func() { stop(ctx.Err()) })
	})
}

// checkWaitEnded checks that a background Wait racing with Destroy returned: with an Exit, or
// with ErrNotFound when it only looked after the environment was gone.
func (s *suite) checkWaitEnded(t *testing.T, what string, ch <-chan Ended) {
	t.Helper()
	r := <-ch // bounded by the Wait's context
	if r.Err != nil {
		assert.ErrorIs(t, r.Err, podworker.ErrNotFound, "%s: Wait during Destroy = %+v; want an exit or ErrNotFound", what, r.Exit)
	}
}

// listed returns the handles List reports with id.
func (s *suite) listed(t *testing.T, b podworker.Backend, id string) []podworker.Handle {
	t.Helper()
	all, err := b.List(s.ctx(t))
	require.NoError(t, err, "List")
	var out []podworker.Handle
	for _, l := range all {
		if l.ID == id {
			out = append(out, l)
		}
	}
	return out
}

// checkListed checks that List reports exactly h, or nothing when want is false (within the
// timeout, with Harness.ListLags).
func (s *suite) checkListed(t *testing.T, b podworker.Backend, h podworker.Handle, want bool) {
	t.Helper()
	if !want {
		if s.h.ListLags {
			assert.True(t, poll(s.h.Timeout, func() bool { return len(s.listed(t, b, h.ID)) == 0 }),
				"List still reports destroyed environment %s after %v", h.ID, s.h.Timeout)
			return
		}
		assert.Empty(t, s.listed(t, b, h.ID), "List reports destroyed environment %s", h.ID)
		return
	}
	assert.Equal(t, []podworker.Handle{h}, s.listed(t, b, h.ID), "List, against what Start returned")
}

// forTask returns the environments List reports for task.
func (s *suite) forTask(t *testing.T, b podworker.Backend, task assignment.TaskID) []podworker.Handle {
	t.Helper()
	all, err := b.List(s.ctx(t))
	require.NoError(t, err, "List")
	var out []podworker.Handle
	for _, l := range all {
		if l.Task == task {
			out = append(out, l)
		}
	}
	return out
}

// checkNoneForTask checks, polling, that List reports no environment of task.
func (s *suite) checkNoneForTask(t *testing.T, b podworker.Backend, task assignment.TaskID) {
	t.Helper()
	var left []podworker.Handle
	if !poll(s.h.Timeout, func() bool { left = s.forTask(t, b, task); return len(left) == 0 }) {
		t.Errorf("task %d left environments: %+v", task, left)
	}
}

func (s *suite) testExit(behavior Behavior, code int) func(t *testing.T) {
	return func(t *testing.T) {
		b := s.h.New(t)
		h := s.start(t, b, s.spec(t, behavior))
		exit := s.wait(t, b, h)
		s.checkCode(t, exit, code, false)
		// Waiting again gives the same answer while the environment exists.
		assert.Equal(t, exit, s.wait(t, b, h), "second Wait, against the first")
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
	exit, err := b.Wait(s.ctx(t), h)
	assert.ErrorIs(t, err, podworker.ErrNotFound, "Wait after Destroy = %+v", exit)
}

// testNotifyCancelled: a podworker.Notifier's registration that is stopped is told so at
// once, with the stop's cause; a second registration on the same environment is told of
// its end, and the first has not been told again by then (a best-effort look: a second call
// that comes later still is not seen).
func (s *suite) testNotifyCancelled(t *testing.T) {
	b := s.h.New(t)
	n, ok := b.(podworker.Notifier)
	if !ok {
		t.Skipf("%s is not a podworker.Notifier: the worker waits in Wait", b.Name())
	}
	h := s.start(t, b, s.spec(t, RunForever))
	s.checkRunning(t, b, h)
	first := make(chan Ended, 2)
	stop := n.Notify(h, func(exit podworker.Exit, err error) { first <- Ended{exit, err} })
	stop(errStopped)
	stop(context.Canceled) // stopping again does nothing
	select {
	case r := <-first:
		require.ErrorIs(t, r.Err, errStopped, "a stopped registration was told %+v", r.Exit)
	case <-time.After(s.h.Timeout):
		t.Fatalf("a registration was not told within %s that it was stopped", s.h.Timeout)
	}
	second := s.waitAsync(t, b, h)
	s.destroy(t, b, h)
	s.checkWaitEnded(t, "the second registration", second)
	select {
	case r := <-first:
		t.Errorf("the cancelled registration was told again: %+v, %v", r.Exit, r.Err)
	default:
	}
}

// errStopped is the cause testNotifyCancelled stops a registration with.
var errStopped = errors.New("podworkertest: registration stopped")

func (s *suite) testDestroyIdempotent(t *testing.T) {
	b := s.h.New(t)
	h := s.start(t, b, s.spec(t, RunForever))
	s.destroy(t, b, h)
	assert.NoError(t, b.Destroy(s.ctx(t), h), "second Destroy")
	assert.NoError(t, s.h.New(t).Destroy(s.ctx(t), h), "Destroy by another instance after Destroy")
	unknown := podworker.Handle{Backend: b.Name(), ID: "dynrunner-conformance-unknown", Task: s.task(), Epoch: 1}
	assert.NoError(t, b.Destroy(s.ctx(t), unknown), "Destroy of an unknown handle")
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
	require.NoError(t, err, "Start on a second instance")
	assert.Equal(t, h, again, "Start on a second instance, against the running environment")
	waited1 := s.waitAsync(t, b1, h)
	waited2 := s.waitAsync(t, b2, h)
	s.destroy(t, b2, h)
	s.checkWaitEnded(t, "starting instance", waited1)
	s.checkWaitEnded(t, "adopting instance", waited2)
	s.checkListed(t, b1, h, false)
	assert.NoError(t, b1.Destroy(s.ctx(t), h), "Destroy by the starting instance after the adopting one")
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
	require.NoError(t, err, "second Start")
	assert.Equal(t, h, again, "second Start, against the running environment")
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
		if !assert.NoError(t, errs[i], "Start %d", i) {
			continue
		}
		h := handles[i]
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		assert.Equal(t, handles[0], h, "concurrent Start %d, against Start 0", i)
	}
	if t.Failed() {
		return
	}
	s.checkListed(t, b, handles[0], true)
	s.checkRunning(t, b, handles[0])
	// The losers' environments are gone: only the winner is left for the task.
	var left []podworker.Handle
	assert.True(t, poll(s.h.Timeout, func() bool { left = s.forTask(t, b, spec.Task); return len(left) == 1 }),
		"concurrent starts of task %d left %+v", spec.Task, left)
	s.destroy(t, b, handles[0])
}

func (s *suite) testNewEpoch(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, RunForever)
	h1 := s.start(t, b, spec)
	spec.Epoch = 2
	h2 := s.start(t, b, spec)
	require.NotEqual(t, h1.ID, h2.ID, "Start of epoch 2 returned the environment of epoch 1")
	s.checkListed(t, b, h1, true)
	s.checkListed(t, b, h2, true)
	s.destroy(t, b, h1)
	s.destroy(t, b, h2)
}

func (s *suite) testSecrets(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, CheckSecrets)
	spec.Files[SecretName] = []byte(SecretContent)
	h := s.start(t, b, spec)
	s.checkCode(t, s.wait(t, b, h), 0, false)
	s.destroy(t, b, h)
}

func (s *suite) testRejectsUnsafeSecretName(t *testing.T) {
	b := s.h.New(t)
	for _, name := range []string{"../escape", "a/b", "..", "", "/abs"} {
		spec := s.spec(t, RunForever)
		spec.Files[name] = []byte("x")
		h, err := b.Start(s.ctx(t), spec)
		if err == nil {
			t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
			t.Errorf("Start with secret file %q succeeded, want an error", name)
			continue
		}
		assert.Empty(t, s.forTask(t, b, spec.Task), "rejected Start of task %d left environments", spec.Task)
	}
}

func (s *suite) testWriteFiles(t *testing.T) {
	b := s.h.New(t)
	h := s.start(t, b, s.spec(t, WriteFilesAndExit))
	s.checkCode(t, s.wait(t, b, h), 0, false)
	s.destroy(t, b, h)
}

func (s *suite) testNeverReady(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, NeverReady)
	h, err := b.Start(s.ctx(t), spec)
	if err == nil {
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
	}
	require.Error(t, err, "Start of an environment that never becomes ready = %+v", h)
	t.Logf("Start error: %v", err)
	s.checkNoneForTask(t, b, spec.Task)
}

// testDiagnose checks that Diagnose names why a failed environment ended, with the executor's
// or launcher's own line, and says nothing of one that succeeded.
func (s *suite) testDiagnose(t *testing.T) {
	b := s.h.New(t)
	d, ok := b.(podworker.Diagnoser)
	require.True(t, ok, "%T does not implement podworker.Diagnoser; declare Harness.Without[%s] with the reason", b, CheckDiagnose)

	ok0 := s.start(t, b, s.spec(t, ExitZero))
	s.checkCode(t, s.wait(t, b, ok0), 0, false)
	line, err := d.Diagnose(s.ctx(t), ok0)
	require.NoError(t, err, "Diagnose of a successful environment")
	assert.Empty(t, line, "Diagnose of a successful environment")

	failed := s.start(t, b, s.spec(t, ExitNonZero))
	s.checkCode(t, s.wait(t, b, failed), NonZeroExitCode, false)
	line, err = d.Diagnose(s.ctx(t), failed)
	require.NoError(t, err, "Diagnose of a failed environment")
	t.Logf("Diagnose: %q", line)
	switch {
	case s.h.DiagnosePrefix != "":
		assert.True(t, strings.HasPrefix(line, s.h.DiagnosePrefix), "Diagnose = %q, want a line starting with %q", line, s.h.DiagnosePrefix)
	case line != "":
		assert.True(t, strings.HasPrefix(line, podworker.ExecutorErrorPrefix) || strings.HasPrefix(line, podworker.LauncherErrorPrefix),
			"Diagnose = %q: not the executor's or launcher's own line", line)
	}
	s.destroy(t, b, ok0)
	s.destroy(t, b, failed)
}

func (s *suite) testTokenOnlyThroughNonce(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, RunForever)
	h := s.start(t, b, spec)
	token, err := s.h.Nonce.Redeem(t, h)
	require.NoError(t, err, "redeem the environment's nonce")
	assert.Equal(t, string(spec.Files[podworker.TokenFile]), token, "the nonce redeemed another token")
	_, err = s.h.Nonce.Redeem(t, h)
	assert.Error(t, err, "the nonce redeemed twice")
	s.destroy(t, b, h)
}

func (s *suite) testMissingToken(t *testing.T) {
	b := s.h.New(t)
	spec := s.spec(t, RunForever)
	spec.Files = nil
	h, err := b.Start(s.ctx(t), spec)
	if err == nil {
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
	}
	require.Error(t, err, "Start without a capability token = %+v", h)
	s.checkNoneForTask(t, b, spec.Task)
}

// testTokenNeverSent runs after every check that starts environments: no token the suite gave
// out appears in anything the backend sent.
func (s *suite) testTokenNeverSent(t *testing.T) {
	if s.h.Nonce.Received == nil {
		t.Skip("not supported: NonceHarness.Received is not set")
	}
	s.mu.Lock()
	tokens := slices.Clone(s.tokens)
	s.mu.Unlock()
	received := s.h.Nonce.Received(t)
	require.NotEmpty(t, received, "NonceHarness.Received returned nothing: it must return what the backend sent")
	for _, r := range received {
		for _, tok := range tokens {
			if bytes.Contains(r, tok) {
				require.Fail(t, "a capability token reached the environment side", "%q", r)
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
