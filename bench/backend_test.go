package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

// noopBackend is a podworker.Backend of no-op environments. An environment launches once its
// `started` record is visible: a real one takes far longer to boot than that append, and its
// runner's Register would be refused before it. It either runs in this process (run, in a
// goroutine that is the environment) or elsewhere (send hands its spec to an envHost and it
// lives until destroyed), so that in the memory benchmark the backend adds no goroutine of its
// own to the controller.
type noopBackend struct {
	run  func(ctx context.Context, spec envSpec) error
	send func(spec envSpec)

	ctx    context.Context
	cancel context.CancelFunc
	seq    atomic.Int64
	wg     sync.WaitGroup
	// doubles counts environments that more than one Wait watched: the worker adopting an
	// environment it is itself starting.
	doubles atomic.Int64

	mu   sync.Mutex
	envs map[assignment.TaskID]*noopEnv

	errMu    sync.Mutex
	failed   int
	firstErr error // the first environment error, for the benchmark's failure message
}

type noopEnv struct {
	h      podworker.Handle
	files  map[string][]byte // until launched
	once   sync.Once
	launch chan struct{} // closed when the environment may launch
	done   chan struct{} // closed when it ended
	exit   podworker.Exit
	cancel context.CancelFunc
	waits  atomic.Int32
	// exitOnce ends an environment that runs elsewhere once: killed (cancel) or exited.
	exitOnce sync.Once

	mu     sync.Mutex
	notify []func() // Notify registrations, run once the environment ended
}

var _ podworker.Notifier = (*noopBackend)(nil)

// newLocalBackend runs each environment as run in a goroutine of this process.
func newLocalBackend(run func(ctx context.Context, spec envSpec) error) *noopBackend {
	return newNoopBackend(run, nil)
}

// newRemoteBackend hands each environment to send, which must not block.
func newRemoteBackend(send func(spec envSpec)) *noopBackend {
	return newNoopBackend(nil, send)
}

func newNoopBackend(run func(context.Context, envSpec) error, send func(envSpec)) *noopBackend {
	ctx, cancel := context.WithCancel(context.Background())
	return &noopBackend{run: run, send: send, ctx: ctx, cancel: cancel, envs: make(map[assignment.TaskID]*noopEnv)}
}

func (n *noopBackend) Name() string { return "noop" }

func (n *noopBackend) Start(_ context.Context, spec podworker.Spec) (podworker.Handle, error) {
	e := &noopEnv{
		h:     podworker.Handle{Backend: "noop", ID: fmt.Sprintf("noop-%d", n.seq.Add(1)), Task: spec.Task, Epoch: spec.Epoch},
		files: spec.Files, launch: make(chan struct{}), done: make(chan struct{}),
	}
	if n.run == nil {
		// Elsewhere: killing it ends it, as a container's engine reports; no context of its
		// own, as a real backend keeps none per environment. Close kills the rest.
		e.cancel = func() { e.exitOnce.Do(func() { e.end(podworker.Exit{Code: 137, Reason: "killed"}) }) }
		n.mu.Lock()
		n.envs[spec.Task] = e
		n.mu.Unlock()
		return e.h, nil
	}
	ctx, cancel := context.WithCancel(n.ctx)
	e.cancel = cancel
	n.mu.Lock()
	n.envs[spec.Task] = e
	n.mu.Unlock()
	n.wg.Go(func() {
		select {
		case <-e.launch:
		case <-ctx.Done():
			e.end(podworker.Exit{Code: 137, Reason: "killed"})
			return
		}
		err := n.run(ctx, envSpec{Task: e.h.Task, Epoch: e.h.Epoch, Files: e.files})
		switch {
		case err == nil:
			e.end(podworker.Exit{Code: 0, Reason: "exited"})
		case errCancelled(ctx, err):
			e.end(podworker.Exit{Code: 137, Reason: "killed"})
		default:
			n.fail(err)
			e.end(podworker.Exit{Code: 1, Reason: "exited"})
		}
	})
	return e.h, nil
}

func (e *noopEnv) end(exit podworker.Exit) {
	e.mu.Lock()
	e.exit = exit
	close(e.done)
	notify := e.notify
	e.notify = nil
	e.mu.Unlock()
	for _, f := range notify {
		f()
	}
}

// onEnd runs f once the environment ended: now, if it has.
func (e *noopEnv) onEnd(f func()) {
	e.mu.Lock()
	select {
	case <-e.done:
		e.mu.Unlock()
		f()
		return
	default:
	}
	e.notify = append(e.notify, f)
	e.mu.Unlock()
}

// exited ends the environment of task that ran elsewhere (newRemoteBackend) and exited 0.
func (n *noopBackend) exited(task assignment.TaskID) {
	n.mu.Lock()
	e, ok := n.envs[task]
	n.mu.Unlock()
	if ok {
		e.exitOnce.Do(func() { e.end(podworker.Exit{Code: 0, Reason: "exited"}) })
	}
}

func (n *noopBackend) fail(err error) {
	n.errMu.Lock()
	defer n.errMu.Unlock()
	if n.failed++; n.firstErr == nil {
		n.firstErr = err
	}
}

// observe is a View.OnChange subscriber: it launches an environment once the worker's
// `started` append (or anything later) for its assignment is visible. It never blocks.
func (n *noopBackend) observe(st assignment.State) {
	switch st.Phase {
	case assignment.Claimed, assignment.Dispatched:
		return
	}
	n.mu.Lock()
	e, ok := n.envs[st.Task]
	n.mu.Unlock()
	if !ok || e.h.Epoch != st.Epoch() {
		return
	}
	e.once.Do(func() {
		if n.send != nil {
			n.send(envSpec{Task: e.h.Task, Epoch: e.h.Epoch, Files: e.files})
			e.files = nil
		}
		close(e.launch)
	})
}

func (n *noopBackend) Wait(ctx context.Context, h podworker.Handle) (podworker.Exit, error) {
	n.mu.Lock()
	e, ok := n.envs[h.Task]
	n.mu.Unlock()
	if !ok || e.h.ID != h.ID {
		return podworker.Exit{}, podworker.ErrNotFound
	}
	if e.waits.Add(1) == 2 {
		n.doubles.Add(1)
	}
	defer e.waits.Add(-1)
	select {
	case <-e.done:
		return e.exit, nil
	case <-ctx.Done():
		return podworker.Exit{}, ctx.Err()
	}
}

// Notify is Wait without a goroutine or a context per environment, as a backend with one
// event stream for all its environments has: the registration runs when the environment ends,
// or when it is stopped.
func (n *noopBackend) Notify(h podworker.Handle, ended func(podworker.Exit, error)) func(error) {
	n.mu.Lock()
	e, ok := n.envs[h.Task]
	n.mu.Unlock()
	if !ok || e.h.ID != h.ID {
		go ended(podworker.Exit{}, podworker.ErrNotFound)
		return func(error) {}
	}
	if e.waits.Add(1) == 2 {
		n.doubles.Add(1)
	}
	var once sync.Once
	report := func(exit podworker.Exit, err error) {
		once.Do(func() {
			e.waits.Add(-1)
			go ended(exit, err)
		})
	}
	e.onEnd(func() { report(e.exit, nil) })
	return func(cause error) {
		if cause == nil {
			cause = context.Canceled
		}
		report(podworker.Exit{}, cause)
	}
}

// Destroy ends the environment; one that is already gone is no error.
func (n *noopBackend) Destroy(_ context.Context, h podworker.Handle) error {
	n.mu.Lock()
	e, ok := n.envs[h.Task]
	if ok && e.h.ID == h.ID {
		delete(n.envs, h.Task)
	}
	n.mu.Unlock()
	if ok && e.h.ID == h.ID {
		e.cancel()
	}
	return nil
}

func (n *noopBackend) List(context.Context) ([]podworker.Handle, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	hs := make([]podworker.Handle, 0, len(n.envs))
	for _, e := range n.envs {
		hs = append(hs, e.h)
	}
	return hs, nil
}

// checkDoubles fails the benchmark if the worker watched an environment twice. That is
// the pod worker's reaper adopting an environment that handle is still starting (sweep finds
// it `started` in the view before handle registers it as its own): each time a concurrency
// slot leaks, and with every slot in use the worker stops taking dispatches.
func (n *noopBackend) checkDoubles(b *testing.B) {
	b.Helper()
	require.Zero(b, n.doubles.Load(), "environments the pod worker watched twice, each leaking a concurrency slot: its reaper adopted "+
		"environments it was still starting (podworker.Worker.sweep vs handle)")
}

// launchErr returns how many environments failed and the first failure.
func (n *noopBackend) launchErr() (int, error) {
	n.errMu.Lock()
	defer n.errMu.Unlock()
	return n.failed, n.firstErr
}

// Close ends every environment and waits for those running here. It is idempotent.
func (n *noopBackend) Close() {
	n.cancel()
	n.wg.Wait()
	if n.run == nil {
		n.mu.Lock()
		envs := slices.Collect(maps.Values(n.envs))
		n.mu.Unlock()
		for _, e := range envs {
			e.cancel()
		}
	}
}
