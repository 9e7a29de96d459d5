package podworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/grants"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/podworker"
)

// memBackend is an in-memory Backend whose environments live until ended by the test.
type memBackend struct {
	mu        sync.Mutex
	envs      map[string]*memEnv
	failStart error
	starts    int
	destroyed []string
	lists     int
	waiting   map[string]int    // Wait calls blocked on each environment: the workers watching it
	waits     int               // Wait calls made (Notify's are not)
	tokens    map[string]string // the capability token each environment was started with
	specs     map[string]podworker.Spec
}

type memEnv struct {
	h      podworker.Handle
	done   chan struct{}
	code   int
	reason string
	// notify are the Notify registrations waiting for the environment to end.
	notify []func(podworker.Exit)
}

// end closes e and returns its Notify registrations, to be called after m.mu is released.
func (e *memEnv) end(code int, reason string) []func(podworker.Exit) {
	e.code, e.reason = code, reason
	close(e.done)
	return e.notify
}

// exit is how e ended, for Wait and Notify.
func (e *memEnv) exit() podworker.Exit {
	reason := e.reason
	if reason == "" {
		reason = "exited" // destroyed
	}
	return podworker.Exit{Code: e.code, Reason: reason}
}

func fire(notify []func(podworker.Exit), exit podworker.Exit) {
	for _, f := range notify {
		f(exit)
	}
}

func newMem() *memBackend {
	return &memBackend{envs: map[string]*memEnv{}, waiting: map[string]int{}, tokens: map[string]string{}, specs: map[string]podworker.Spec{}}
}

func (m *memBackend) Name() string { return "mem" }

func (m *memBackend) Start(_ context.Context, spec podworker.Spec) (podworker.Handle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.starts++
	if m.failStart != nil {
		return podworker.Handle{}, m.failStart
	}
	tok, ok := spec.Files[podworker.TokenFile]
	if _, jit := spec.Files[executor.JITConfigFile]; !ok && !jit {
		return podworker.Handle{}, errors.New("no capability token and no JIT configuration")
	}
	id := fmt.Sprintf("%d-%d", spec.Task, spec.Epoch)
	m.tokens[id] = string(tok)
	m.specs[id] = spec
	h := podworker.Handle{Backend: "mem", ID: id, Task: spec.Task, Epoch: spec.Epoch}
	m.envs[id] = &memEnv{h: h, done: make(chan struct{})}
	return h, nil
}

func (m *memBackend) add(h podworker.Handle) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.envs[h.ID] = &memEnv{h: h, done: make(chan struct{})}
}

func (m *memBackend) exit(id string, code int) { m.exitWith(id, code, "exited") }

// exitWith ends environment id with code, for reason (an Exit's).
func (m *memBackend) exitWith(id string, code int, reason string) {
	m.mu.Lock()
	e, ok := m.envs[id]
	var notify []func(podworker.Exit)
	if ok {
		notify = e.end(code, reason)
		delete(m.envs, id)
	}
	m.mu.Unlock()
	if ok {
		fire(notify, e.exit())
	}
}

func (m *memBackend) Wait(ctx context.Context, h podworker.Handle) (podworker.Exit, error) {
	m.mu.Lock()
	e, ok := m.envs[h.ID]
	m.mu.Unlock()
	if !ok {
		return podworker.Exit{}, podworker.ErrNotFound
	}
	m.mu.Lock()
	m.waiting[h.ID]++
	m.waits++
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.waiting[h.ID]--
		m.mu.Unlock()
	}()
	select {
	case <-e.done:
		return e.exit(), nil
	case <-ctx.Done():
		return podworker.Exit{}, ctx.Err()
	}
}

// Notify is Wait without a goroutine per environment: the registration is called when the
// environment ends, or when it is stopped. It counts in watchers as Wait does.
func (m *memBackend) Notify(h podworker.Handle, ended func(podworker.Exit, error)) func(error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.envs[h.ID]
	if !ok {
		go ended(podworker.Exit{}, podworker.ErrNotFound)
		return func(error) {}
	}
	m.waiting[h.ID]++
	var once sync.Once
	done := func(exit podworker.Exit, err error) {
		once.Do(func() {
			m.mu.Lock()
			m.waiting[h.ID]--
			m.mu.Unlock()
			go ended(exit, err)
		})
	}
	e.notify = append(e.notify, func(exit podworker.Exit) { done(exit, nil) })
	return func(cause error) {
		if cause == nil {
			cause = context.Canceled
		}
		done(podworker.Exit{}, cause)
	}
}

func (m *memBackend) Destroy(_ context.Context, h podworker.Handle) error {
	m.mu.Lock()
	e, ok := m.envs[h.ID]
	var notify []func(podworker.Exit)
	if ok {
		notify = e.end(e.code, e.reason)
		delete(m.envs, h.ID)
		m.destroyed = append(m.destroyed, h.ID)
	}
	m.mu.Unlock()
	if ok {
		fire(notify, e.exit())
	}
	return nil
}

func (m *memBackend) List(context.Context) ([]podworker.Handle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lists++
	var out []podworker.Handle
	for _, e := range m.envs {
		out = append(out, e.h)
	}
	return out, nil
}

func (m *memBackend) has(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.envs[id]
	return ok
}

// watchers counts the workers whose Wait blocks on an environment.
func (m *memBackend) watchers(id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.waiting[id]
}

// listed counts the List calls: every sweep makes one.
func (m *memBackend) listed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lists
}

var _ podworker.Notifier = (*memBackend)(nil)

// waitOnly hides a backend's Notify: the worker then waits in Wait, one goroutine per
// environment, as it does for backends that are not Notifiers.
type waitOnly struct{ podworker.Backend }

// share is one worker's view of a memBackend several workers share: it counts that worker's
// sweeps and the environments it watches.
type share struct {
	*memBackend
	sweeps  atomic.Int64
	waiting atomic.Int64
}

func (s *share) List(ctx context.Context) ([]podworker.Handle, error) {
	s.sweeps.Add(1)
	return s.memBackend.List(ctx)
}

func (s *share) Wait(ctx context.Context, h podworker.Handle) (podworker.Exit, error) {
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	return s.memBackend.Wait(ctx, h)
}

func (s *share) Notify(h podworker.Handle, ended func(podworker.Exit, error)) func(error) {
	s.waiting.Add(1)
	return s.memBackend.Notify(h, func(exit podworker.Exit, err error) {
		s.waiting.Add(-1)
		ended(exit, err)
	})
}

type rig struct {
	// wrapView, when set, is what the workers started next see of their view.
	wrapView func(podworker.View) podworker.View
	t        *testing.T
	conn     *natsconn.Conn
	log      *eventlog.Log
	view     *eventlog.View
	js       jetstream.JetStream
}

func newRig(t *testing.T) *rig {
	t.Helper()
	return newRigHeartbeat(t, 0)
}

// newRigHeartbeat is newRig with the workers' keys expiring after three heartbeats (the
// default TTL when heartbeat is 0).
func newRigHeartbeat(t *testing.T, heartbeat time.Duration) *rig {
	t.Helper()
	c, js := eventlogtest.Connect(t)
	cfg := eventlog.DefaultConfig()
	cfg.Key = eventlogtest.Key
	cfg.DispatchMaxDeliver = 3
	cfg.WorkersTTL = 3 * heartbeat
	l, err := eventlog.Open(t.Context(), js, cfg)
	require.NoError(t, err)
	return &rig{t: t, conn: c, log: l, js: js}
}

// replica opens another connection to the rig's server and the event log over it, as
// another controller replica has; closing the connection cuts that replica off, as a crash
// would.
func (r *rig) replica() (*nats.Conn, *eventlog.Log) {
	r.t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(r.conn.Server))
	require.NoError(r.t, err)
	r.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(r.t, err)
	l, err := eventlog.Open(r.t.Context(), js, r.log.Config())
	require.NoError(r.t, err)
	return nc, l
}

// run starts a view and a worker over backend; the returned function stops both.
// capabilityKey is the capability key of the workers the rig starts.
var capabilityKey = []byte("0123456789abcdef0123456789abcdef")

func (r *rig) run(backend podworker.Backend) (stop func()) {
	r.t.Helper()
	return r.runWorker(r.log, backend, podworker.Config{Actor: "worker-test", Reap: time.Hour})
}

// runWorker starts a view and a worker over backend on l, configured by cfg (its actor, reap
// interval and heartbeat); the returned function stops both.
func (r *rig) runWorker(l *eventlog.Log, backend podworker.Backend, cfg podworker.Config) (stop func()) {
	r.t.Helper()
	_, stop = r.startWorker(l, backend, cfg)
	return stop
}

// startWorker is runWorker that returns the worker too.
func (r *rig) startWorker(l *eventlog.Log, backend podworker.Backend, cfg podworker.Config) (_ *podworker.Worker, stop func()) {
	r.t.Helper()
	r.view = eventlog.NewView()
	issuer, err := captoken.NewIssuer(capabilityKey)
	require.NoError(r.t, err)
	cfg.Tier, cfg.Concurrency, cfg.Issuer = assignment.BackendPod, 4, issuer
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = 10 * time.Millisecond
	}
	cfg.Log = zerolog.New(zerolog.NewTestWriter(r.t)).With().Str("actor", cfg.Actor).Logger()
	view := r.view
	var wview podworker.View = view
	if r.wrapView != nil {
		wview = r.wrapView(view)
	}
	w := podworker.New(cfg, backend, l, wview)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Watch(ctx, view) })
	errc := make(chan error, 1)
	wg.Go(func() { errc <- w.Run(ctx) })
	select {
	case <-w.Ready():
	case err := <-errc:
		r.t.Fatalf("worker stopped: %v", err)
	case <-time.After(10 * time.Second):
		r.t.Fatal("worker not ready within 10s")
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		wg.Wait()
		assert.NoError(r.t, <-errc, "worker Run on cancellation")
	}
	r.t.Cleanup(stop)
	return w, stop
}

func (r *rig) claim(task assignment.TaskID) assignment.State {
	r.t.Helper()
	st, err := r.log.Apply(r.t.Context(), assignment.Event{Transition: assignment.Claimed, Task: task, At: time.Now(), Actor: "test",
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(r.t, err)
	require.NoError(r.t, r.log.Dispatch(r.t.Context(), assignment.BackendPod, task, st.Epoch()))
	return st
}

func (r *rig) phase(task assignment.TaskID) assignment.State {
	st, err := r.log.Get(r.t.Context(), task)
	require.NoError(r.t, err)
	return st
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWorkerStartsRecordsAndFailsEarlyExit(t *testing.T) {
	t.Run("notify", func(t *testing.T) { testStartsRecordsAndFailsEarlyExit(t, false) })
	t.Run("wait", func(t *testing.T) { testStartsRecordsAndFailsEarlyExit(t, true) })
}

// testStartsRecordsAndFailsEarlyExit runs the worker over a memBackend, through its Notify or,
// with wait, through Wait.
func testStartsRecordsAndFailsEarlyExit(t *testing.T, wait bool) {
	r := newRig(t)
	mem := newMem()
	if wait {
		r.run(waitOnly{mem})
	} else {
		r.run(mem)
	}
	st := r.claim(1)
	id := fmt.Sprintf("1-%d", st.Epoch())
	eventually(t, "started", func() bool { return r.phase(1).Phase == assignment.Started })
	got := r.phase(1)
	var h podworker.Handle
	require.NoError(t, json.Unmarshal(got.Handle, &h), "started record: handle %s", got.Handle)
	require.Equal(t, id, h.ID, "started record: handle id")
	require.NotEmpty(t, got.TokenID, "started record: token id")
	// The environment's token is bound to the assignment and expires with its pickup deadline.
	issuer, err := captoken.NewIssuer(capabilityKey)
	require.NoError(t, err)
	mem.mu.Lock()
	wire := mem.tokens[id]
	mem.mu.Unlock()
	tok, err := issuer.Verify(wire)
	require.NoError(t, err, "the environment's capability token")
	assert.Equal(t, got.TokenID, tok.ID(), "token id")
	assert.Equal(t, assignment.TaskID(1), tok.Task(), "token task")
	assert.Equal(t, st.Epoch(), tok.Epoch(), "token epoch")
	assert.Equal(t, captoken.PurposeRegister, tok.Purpose(), "token purpose")
	require.False(t, got.PickupDeadline.IsZero(), "started record: pickup deadline")
	assert.Equal(t, got.PickupDeadline.Truncate(time.Second).UTC(), tok.Expires(), "token expiry, want the pickup deadline")
	// The environment dies before the job completed: the assignment fails with a reason. The
	// worker must be waiting on it first: the memory backend forgets an environment that exits
	// unwatched, where a real one keeps its exit code.
	eventually(t, "the worker waits on the environment", func() bool { return mem.watchers(id) == 1 })
	mem.exit(id, 2)
	eventually(t, "failed", func() bool { return r.phase(1).Phase == assignment.Failed })
	assert.Contains(t, r.phase(1).Reason, "exit code 2", "the reason does not give the exit code")
	mem.mu.Lock()
	defer mem.mu.Unlock()
	if wait {
		assert.Positive(t, mem.waits, "the worker did not wait in Wait")
	} else {
		assert.Zero(t, mem.waits, "the worker waited in Wait on a Notifier: a goroutine per environment")
	}
}

// TestWorkerRefusesAssignmentsItsGrantsDoNotCover: the worker checks GRANTS_FILE again
// before it starts an environment (defence in depth: a claim made by a scheduler with another
// policy, or a record that says so). An assignment whose grant does not cover its tier fails,
// naming the grant, and nothing starts; one whose grant covers it starts.
func TestWorkerRefusesAssignmentsItsGrantsDoNotCover(t *testing.T) {
	r := newRig(t)
	mem := newMem()
	policy, err := grants.Parse([]byte("owners:\n  contractors: [vm]\n"))
	require.NoError(t, err)
	r.runWorker(r.log, mem, podworker.Config{Actor: "worker-test", Reap: time.Hour, Grants: policy})
	claim := func(task assignment.TaskID, repo string) {
		st, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: task, At: time.Now(), Actor: "test",
			Backend: assignment.BackendPod, Repo: repo, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
		require.NoError(t, err)
		require.NoError(t, r.log.Dispatch(t.Context(), assignment.BackendPod, task, st.Epoch()))
	}
	claim(1, "contractors/app")
	claim(2, "acme/site")
	eventually(t, "the granted assignment started", func() bool { return r.phase(2).Phase == assignment.Started })
	eventually(t, "the refused assignment failed", func() bool { return r.phase(1).Phase == assignment.Failed })
	assert.Equal(t, `the pod worker refused it: isolation tier not granted: the job asks for pod, but grant owners["contractors"] of GRANTS_FILE allows repository contractors/app only [vm]; use runs-on: [self-hosted, vm]`, r.phase(1).Reason)
	mem.mu.Lock()
	defer mem.mu.Unlock()
	assert.Equal(t, 1, mem.starts, "environments started: only the granted one")
}

func TestWorkerDeadLettersAfterMaxDeliver(t *testing.T) {
	r := newRig(t)
	mem := newMem()
	mem.failStart = errors.New("no capacity")
	r.run(mem)
	r.claim(2)
	eventually(t, "failed", func() bool { return r.phase(2).Phase == assignment.Failed })
	assert.Contains(t, r.phase(2).Reason, "no capacity", "the reason does not say why")
	mem.mu.Lock()
	starts := mem.starts
	mem.mu.Unlock()
	assert.Equal(t, 3, starts, "start attempts, want MaxDeliver")
	st, err := r.js.Stream(t.Context(), eventlog.StreamDead)
	require.NoError(t, err)
	// The worker fails the assignment first and dead-letters the message after.
	var msg *jetstream.RawStreamMsg
	eventually(t, "the dead letter", func() bool {
		msg, err = st.GetLastMsgForSubject(t.Context(), eventlog.SubjectDead+"pod")
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			require.NoError(t, err, "read the dead letter")
		}
		return err == nil
	})
	assert.Contains(t, msg.Header.Get("Dynrunner-Reason"), "no capacity", "dead letter reason")
}

// hidingView is a view that lacks one task's assignment, as a view started between a claim
// and its key in the live index does.
type hidingView struct {
	podworker.View
	hide assignment.TaskID
}

func (v hidingView) Get(task assignment.TaskID) (assignment.State, bool) {
	if task == v.hide {
		return assignment.State{}, false
	}
	return v.View.Get(task)
}

// TestWorkerReapsOnlyWhatJetStreamDisowns: an environment whose assignment the worker's view
// lacks is not destroyed while JetStream records it live: the sweep reads the assignment
// before it reaps, and adopts the environment.
func TestWorkerReapsOnlyWhatJetStreamDisowns(t *testing.T) {
	r := newRig(t)
	mem := newMem()
	stop := r.run(mem)
	st := r.claim(3)
	eventually(t, "started", func() bool { return r.phase(3).Phase == assignment.Started })
	stop()

	owned := fmt.Sprintf("3-%d", st.Epoch())
	orphan := podworker.Handle{Backend: "mem", ID: "99-1", Task: 99, Epoch: 1}
	mem.add(orphan)
	r.wrapView = func(v podworker.View) podworker.View { return hidingView{View: v, hide: 3} }
	r.run(mem)
	eventually(t, "the orphan reaped", func() bool { return !mem.has(orphan.ID) })
	require.True(t, mem.has(owned), "an environment JetStream records live was reaped because the view lacked its assignment")
	eventually(t, "the environment adopted", func() bool { return mem.watchers(owned) == 1 })
}

func TestWorkerAdoptsOwnedAndReapsOrphans(t *testing.T) {
	r := newRig(t)
	mem := newMem()
	stop := r.run(mem)
	st := r.claim(3)
	eventually(t, "started", func() bool { return r.phase(3).Phase == assignment.Started })
	stop() // a controller restart: the environment keeps running

	owned := fmt.Sprintf("3-%d", st.Epoch())
	orphan := podworker.Handle{Backend: "mem", ID: "99-1", Task: 99, Epoch: 1}
	mem.add(orphan)
	r.run(mem)
	eventually(t, "the orphan reaped", func() bool { return !mem.has(orphan.ID) })
	require.True(t, mem.has(owned), "the owned environment was destroyed instead of adopted")
	// The adopted environment is watched: ending the assignment elsewhere destroys it.
	cur := r.phase(3)
	_, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: 3, Epoch: cur.Epoch(), At: time.Now(), Reason: "lease expired"}, nil)
	require.NoError(t, err)
	eventually(t, "the adopted environment destroyed", func() bool { return !mem.has(owned) })
}

// TestWorkerLeavesEnvironmentsOfLiveWorkers: two workers on one backend (controller replicas
// sharing a namespace). The second does not adopt the first's environment while the first is
// alive, and adopts it once the first stopped cleanly (deleting its key).
func TestWorkerLeavesEnvironmentsOfLiveWorkers(t *testing.T) {
	r := newRigHeartbeat(t, 500*time.Millisecond)
	mem := newMem()
	const a, b = "pod-worker@a/1", "pod-worker@b/2"
	stopA := r.runWorker(r.log, mem, podworker.Config{Actor: a, Reap: time.Hour, Heartbeat: 500 * time.Millisecond})
	st := r.claim(5)
	id := fmt.Sprintf("5-%d", st.Epoch())
	eventually(t, "worker a watches its environment", func() bool { return mem.watchers(id) == 1 })
	require.Equal(t, a, r.phase(5).StartedBy, "started by")

	r.runWorker(r.log, mem, podworker.Config{Actor: b, Reap: 20 * time.Millisecond, Heartbeat: 500 * time.Millisecond})
	swept := mem.listed()
	eventually(t, "worker b sweeps", func() bool { return mem.listed() >= swept+5 })
	require.Equal(t, 1, mem.watchers(id), "workers watching the environment while the worker that started it is alive")

	stopA() // a clean shutdown: a's watch ends, the environment keeps running
	require.Equal(t, 0, mem.watchers(id), "watchers after a stopped")
	require.True(t, mem.has(id), "the environment is gone after a stopped")
	// a deleted its keys as it left, rather than letting them expire: b may already have
	// adopted the environment, but no key names a.
	kv := workersBucket(t, r)
	require.NotEqual(t, a, watcherOf(t, kv, 5, st.Epoch()), "the environment's key right after a left")
	require.False(t, liveActors(t, kv)[a], "a's liveness key right after a left")
	eventually(t, "worker b adopts the environment", func() bool { return mem.watchers(id) == 1 })
	require.Equal(t, b, watcherOf(t, kv, 5, st.Epoch()), "the environment's key names")
	// b watches it: ending the assignment elsewhere destroys the environment, and its key goes.
	cur := r.phase(5)
	_, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: 5, Epoch: cur.Epoch(), At: time.Now(), Reason: "lease expired"}, nil)
	require.NoError(t, err)
	eventually(t, "the adopted environment destroyed", func() bool { return !mem.has(id) })
	eventually(t, "the environment's key deleted", func() bool { return watcherOf(t, kv, 5, st.Epoch()) == "" })
}

// TestWorkerAdoptsEnvironmentsOfCrashedWorker: a worker cut off from NATS (a SIGKILLed
// controller) cannot delete its key; another worker adopts its environment once the key has
// expired, without waiting for its reap interval.
func TestWorkerAdoptsEnvironmentsOfCrashedWorker(t *testing.T) {
	r := newRigHeartbeat(t, 500*time.Millisecond)
	mem := newMem()
	const a, b = "pod-worker@a/1", "pod-worker@b/2"
	nc, la := r.replica()
	stopA := r.runWorker(la, mem, podworker.Config{Actor: a, Reap: time.Hour, Heartbeat: 500 * time.Millisecond})
	st := r.claim(6)
	id := fmt.Sprintf("6-%d", st.Epoch())
	eventually(t, "worker a watches its environment", func() bool { return mem.watchers(id) == 1 })

	r.runWorker(r.log, mem, podworker.Config{Actor: b, Reap: time.Hour, Heartbeat: 500 * time.Millisecond})
	// b is ready: its first sweep is done and left the environment to a.
	require.Equal(t, 1, mem.watchers(id), "workers watching the environment while the worker that started it is alive")
	kv := workersBucket(t, r)
	require.Equal(t, a, watcherOf(t, kv, 6, st.Epoch()), "the environment's key names")
	actors := liveActors(t, kv)
	require.True(t, actors[a] && actors[b], "live workers %v, want %s and %s", actors, a, b)

	nc.Close() // a crashes: no more heartbeats, and its key is not deleted
	stopA()
	eventually(t, "worker b adopts the environment", func() bool { return mem.watchers(id) == 1 })
	// b's key may lapse for a moment on a loaded machine (a heartbeat late past the TTL) and
	// comes back with the next one; a's never does.
	eventually(t, "only b's liveness key", func() bool {
		actors = liveActors(t, kv)
		return !actors[a] && actors[b]
	})
	require.Equal(t, b, watcherOf(t, kv, 6, st.Epoch()), "the environment's key names")
}

// TestWorkerOneOfTwoAdoptsEnvironmentOfCrashedWorker: three workers on one backend. The one
// that started an environment crashes; the two others, sweeping often, both find it unwatched
// once its key expired, and exactly one adopts it. The other keeps leaving it alone, though
// the worker recorded as its starter stays gone.
func TestWorkerOneOfTwoAdoptsEnvironmentOfCrashedWorker(t *testing.T) {
	const heartbeat = time.Second // keys expire 3 s after the last heartbeat
	r := newRigHeartbeat(t, heartbeat)
	mem := newMem()
	const a, b, c = "pod-worker@a/1", "pod-worker@b/2", "pod-worker@c/3"
	nc, la := r.replica()
	stopA := r.runWorker(la, mem, podworker.Config{Actor: a, Reap: time.Hour, Heartbeat: heartbeat})
	st := r.claim(7)
	id := fmt.Sprintf("7-%d", st.Epoch())
	eventually(t, "worker a watches its environment", func() bool { return mem.watchers(id) == 1 })

	_, lc := r.replica()
	sb, sc := &share{memBackend: mem}, &share{memBackend: mem}
	r.runWorker(r.log, sb, podworker.Config{Actor: b, Reap: 20 * time.Millisecond, Heartbeat: heartbeat})
	r.runWorker(lc, sc, podworker.Config{Actor: c, Reap: 20 * time.Millisecond, Heartbeat: heartbeat})
	fromB, fromC := sb.sweeps.Load(), sc.sweeps.Load()
	eventually(t, "workers b and c sweep", func() bool { return sb.sweeps.Load() >= fromB+5 && sc.sweeps.Load() >= fromC+5 })
	require.Equal(t, 1, mem.watchers(id), "workers watching the environment while its watcher is alive")
	require.Zero(t, sb.waiting.Load()+sc.waiting.Load(), "b or c watches the environment while its watcher is alive (b %d, c %d), want only a", sb.waiting.Load(), sc.waiting.Load())

	nc.Close() // a crashes: no more heartbeats, and its keys are not deleted
	stopA()
	// Poll the watchers until one adopted the environment and both swept 20 more times since.
	deadline := time.Now().Add(20 * time.Second)
	adopted := false
	for {
		n := mem.watchers(id)
		require.LessOrEqual(t, n, 1, "workers watching the environment (b %d, c %d)", sb.waiting.Load(), sc.waiting.Load())
		if n == 1 && !adopted {
			adopted = true
			fromB, fromC = sb.sweeps.Load(), sc.sweeps.Load()
		}
		if adopted && sb.sweeps.Load() >= fromB+20 && sc.sweeps.Load() >= fromC+20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: adopted %v, %d watchers", adopted, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	want := b
	if sc.waiting.Load() == 1 {
		want = c
	}
	require.Equal(t, want, watcherOf(t, workersBucket(t, r), 7, st.Epoch()), "the environment's key names")
	require.Equal(t, int64(1), sb.waiting.Load()+sc.waiting.Load(), "watchers: b watches %d, c %d", sb.waiting.Load(), sc.waiting.Load())
	got := r.phase(7)
	require.Equal(t, a, got.StartedBy, "assignment started by")
	require.Equal(t, assignment.Started, got.Phase, "assignment phase")
}

// TestWorkerStopsWatchingWhenAdoptedElsewhere: a worker cut off from NATS for longer than its
// keys' TTL finds, once back, that another worker adopted its environment (the key names that
// worker). It stops watching, and neither fails the assignment nor destroys the environment.
func TestWorkerStopsWatchingWhenAdoptedElsewhere(t *testing.T) {
	r := newRigHeartbeat(t, 200*time.Millisecond)
	mem := newMem()
	r.runWorker(r.log, mem, podworker.Config{Actor: "pod-worker@a/1", Reap: time.Hour, Heartbeat: 200 * time.Millisecond})
	st := r.claim(8)
	id := fmt.Sprintf("8-%d", st.Epoch())
	eventually(t, "the worker watches its environment", func() bool { return mem.watchers(id) == 1 })
	kv := workersBucket(t, r)
	eventually(t, "the environment's key", func() bool { return watcherOf(t, kv, 8, st.Epoch()) == "pod-worker@a/1" })

	// Another worker's adoption, as it would be after a's key expired.
	_, err := kv.Put(t.Context(), fmt.Sprintf("env.8.%d", st.Epoch()), []byte("pod-worker@b/2"))
	require.NoError(t, err)
	eventually(t, "the worker stops watching", func() bool { return mem.watchers(id) == 0 })
	require.True(t, mem.has(id), "the environment was destroyed")
	require.Equal(t, assignment.Started, r.phase(8).Phase, "phase")
}

// TestWorkerDeletesItsKeyRenewedMeanwhile: an environment ends while its key is at a revision
// the worker has not recorded yet (a heartbeat's renewal in flight). The worker still deletes
// the key, which names it, rather than leaving it to expire.
func TestWorkerDeletesItsKeyRenewedMeanwhile(t *testing.T) {
	const actor = "pod-worker@a/1"
	r := newRigHeartbeat(t, time.Hour) // no heartbeat during the test; a key left lives 3 h
	mem := newMem()
	r.runWorker(r.log, mem, podworker.Config{Actor: actor, Reap: time.Hour, Heartbeat: time.Hour})
	st := r.claim(11)
	id := fmt.Sprintf("11-%d", st.Epoch())
	eventually(t, "the worker watches its environment", func() bool { return mem.watchers(id) == 1 })
	kv := workersBucket(t, r)
	eventually(t, "the environment's key", func() bool { return watcherOf(t, kv, 11, st.Epoch()) == actor })
	_, err := kv.Put(t.Context(), fmt.Sprintf("env.11.%d", st.Epoch()), []byte(actor)) // the renewal
	require.NoError(t, err)

	mem.exit(id, 2)
	eventually(t, "failed", func() bool { return r.phase(11).Phase == assignment.Failed })
	eventually(t, "the environment's key deleted", func() bool { return watcherOf(t, kv, 11, st.Epoch()) == "" })
}

func workersBucket(t *testing.T, r *rig) jetstream.KeyValue {
	t.Helper()
	kv, err := r.js.KeyValue(t.Context(), eventlog.BucketWorkers)
	require.NoError(t, err)
	return kv
}

// watcherOf returns the actor the key of task's environment in epoch names, "" when it has none.
func watcherOf(t *testing.T, kv jetstream.KeyValue, task assignment.TaskID, epoch assignment.Epoch) string {
	t.Helper()
	e, err := kv.Get(t.Context(), fmt.Sprintf("env.%d.%d", task, epoch))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ""
	}
	require.NoError(t, err)
	return string(e.Value())
}

// liveActors returns the actors BucketWorkers holds a worker key of (environments' keys,
// env.<task>.<epoch>, are not workers').
func liveActors(t *testing.T, kv jetstream.KeyValue) map[string]bool {
	t.Helper()
	keys, err := kv.ListKeys(t.Context())
	require.NoError(t, err)
	out := map[string]bool{}
	for k := range keys.Keys() {
		if strings.HasPrefix(k, "env.") {
			continue
		}
		e, err := kv.Get(t.Context(), k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		require.NoError(t, err)
		out[string(e.Value())] = true
	}
	return out
}

// TestWorkerIgnoresForgedRecords: someone with the NATS password but not the record key appends
// a `failed` record over a running environment and a dispatch for a task never claimed, through
// its own connection. The environment keeps running, nothing is started for the dispatch, and
// the dispatch ends as a dead letter.
func TestWorkerIgnoresForgedRecords(t *testing.T) {
	r := newRig(t)
	mem := newMem()
	r.run(mem)
	st := r.claim(1)
	id := fmt.Sprintf("1-%d", st.Epoch())
	eventually(t, "started", func() bool { return r.phase(1).Phase == assignment.Started })

	nc, err := nats.Connect("", nats.InProcessServer(r.conn.Server))
	require.NoError(t, err)
	defer nc.Close()
	attacker, err := jetstream.New(nc)
	require.NoError(t, err)
	rec := r.phase(1).Record
	rec.Transition, rec.Phase, rec.Reason = assignment.Failed, assignment.Failed, "forged"
	data, err := json.Marshal(rec)
	require.NoError(t, err)
	_, err = attacker.Publish(t.Context(), eventlog.RecordSubject(1, assignment.Failed), data)
	require.NoError(t, err)
	_, err = attacker.Publish(t.Context(), eventlog.SubjectDispatch+"pod", []byte(`{"task_id":2,"epoch":1}`))
	require.NoError(t, err)

	// Nothing but the worker's view reads task 1 until the view quarantined the record.
	dead, err := r.js.Stream(t.Context(), eventlog.StreamDead)
	require.NoError(t, err)
	eventually(t, "the view quarantined the forged record", func() bool {
		_, err := dead.GetLastMsgForSubject(t.Context(), eventlog.SubjectQuarantine)
		return err == nil
	})
	eventually(t, "the forged dispatch dead-lettered", func() bool {
		_, err := dead.GetLastMsgForSubject(t.Context(), eventlog.SubjectDead+"pod")
		return err == nil
	})
	v, ok := r.view.Get(1)
	require.True(t, ok)
	assert.Equal(t, assignment.Started, v.Phase)
	assert.Equal(t, assignment.Started, r.phase(1).Phase)
	assert.True(t, mem.has(id), "the forged failure destroyed the environment")
	mem.mu.Lock()
	assert.Equal(t, 1, mem.starts, "an environment was started for the forged dispatch")
	mem.mu.Unlock()
}

// refreshing is a memBackend whose environments' secret files can be replaced.
type refreshing struct {
	*memBackend
	mu        sync.Mutex
	refreshed map[string][]time.Time // notAfter of each refresh, by environment
}

func (r *refreshing) Refresh(_ context.Context, h podworker.Handle, files map[string][]byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshed[h.ID] = append(r.refreshed[h.ID], mustTime(string(files["not-after"])))
	return nil
}

func (r *refreshing) refreshes(id string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.refreshed[id]...)
}

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

// leaseIdentity issues "identity files" naming the time they are valid until.
type leaseIdentity struct{}

func (leaseIdentity) Files(_ assignment.TaskID, _ assignment.Epoch, notAfter time.Time) (map[string][]byte, error) {
	return map[string][]byte{"not-after": []byte(notAfter.Format(time.RFC3339Nano))}, nil
}

// TestWorkerRenewsIdentityWithTheLease: an environment's identity is issued for its lease and
// issued again, for the new lease, every time the lease is renewed; so no SVID outlives it.
func TestWorkerRenewsIdentityWithTheLease(t *testing.T) {
	r := newRig(t)
	b := &refreshing{memBackend: newMem(), refreshed: map[string][]time.Time{}}
	r.runWorker(r.log, b, podworker.Config{Actor: "worker-test", Reap: time.Hour, Identity: leaseIdentity{}})
	st := r.claim(1)
	id := fmt.Sprintf("1-%d", st.Epoch())
	eventually(t, "started", func() bool { return r.phase(1).Phase == assignment.Started })
	cur := r.phase(1)
	for i := 1; i <= 2; i++ {
		next, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Renewed, Task: 1, Epoch: st.Epoch(),
			At: time.Now().Add(time.Duration(i) * time.Minute), Actor: "facade", Lease: 5 * time.Minute}, &cur)
		require.NoError(t, err)
		require.True(t, next.LeaseExpires.After(cur.LeaseExpires))
		cur = next
		eventually(t, "identity renewed", func() bool { return len(b.refreshes(id)) == i })
		assert.True(t, b.refreshes(id)[i-1].Equal(cur.LeaseExpires), "renewed identity valid until %s, the lease ends %s", b.refreshes(id)[i-1], cur.LeaseExpires)
	}
}

// renewingView renews the lease of the assignment whose `started` the worker records, before
// the worker goes on to watch its environment, and waits until the worker was told of the
// renewal: the renewal comes while the environment has no handle in the worker yet.
type renewingView struct {
	podworker.View
	t       *testing.T
	log     *eventlog.Log
	renewed chan assignment.State
	once    sync.Once
}

func (v *renewingView) OnChange(fn func(assignment.State)) {
	v.View.OnChange(fn)
	v.View.OnChange(func(st assignment.State) { // after the worker's
		if st.Transition == assignment.Renewed {
			select {
			case v.renewed <- st:
			default:
			}
		}
	})
}

func (v *renewingView) Observe(st assignment.State) {
	v.View.Observe(st)
	if st.Transition != assignment.Started {
		return
	}
	v.once.Do(func() {
		_, err := v.log.Apply(context.Background(), assignment.Event{Transition: assignment.Renewed, Task: st.Task, Epoch: st.Epoch(),
			At: time.Now().Add(time.Minute), Actor: "facade", Lease: 5 * time.Minute}, &st)
		assert.NoError(v.t, err, "renew")
		select {
		case <-v.renewed:
		case <-time.After(10 * time.Second):
			assert.Fail(v.t, "the worker was not told of the renewal")
		}
	})
}

// TestWorkerRenewsIdentityRenewedWhileStarting: a lease renewed between the environment's
// `started` and the worker watching it (the worker had no handle to renew its identity with
// when told) still renews the identity, once.
func TestWorkerRenewsIdentityRenewedWhileStarting(t *testing.T) {
	r := newRig(t)
	r.wrapView = func(v podworker.View) podworker.View {
		return &renewingView{View: v, t: t, log: r.log, renewed: make(chan assignment.State, 1)}
	}
	b := &refreshing{memBackend: newMem(), refreshed: map[string][]time.Time{}}
	r.runWorker(r.log, b, podworker.Config{Actor: "worker-test", Reap: time.Hour, Identity: leaseIdentity{}})
	st := r.claim(1)
	id := fmt.Sprintf("1-%d", st.Epoch())
	eventually(t, "identity renewed", func() bool { return len(b.refreshes(id)) > 0 })
	cur := r.phase(1)
	require.Equal(t, assignment.Renewed, cur.Transition)
	assert.Equal(t, []time.Time{cur.LeaseExpires}, b.refreshes(id), "identity renewals")
}

// TestWorkerMeasuresStartsAndJobs: the worker that starts an environment records how long the
// start took and the wait since the claim, and the duration of its job by result once the
// job ends.
func TestWorkerMeasuresStartsAndJobs(t *testing.T) {
	r := newRig(t)
	reg := prometheus.NewRegistry()
	r.runWorker(r.log, newMem(), podworker.Config{Actor: "worker-test", Reap: time.Hour, Metrics: podworker.NewMetrics(reg)})
	r.claim(1)
	eventually(t, "started", func() bool { return r.phase(1).Phase == assignment.Started })
	count := func(name string) int {
		n, err := testutil.GatherAndCount(reg, name)
		require.NoError(t, err)
		return n
	}
	require.Equal(t, 1, count("dynrunner_environment_start_seconds"))
	require.Equal(t, 1, count("dynrunner_queue_to_start_seconds"))
	require.Zero(t, count("dynrunner_job_duration_seconds"), "a job measured before it ended")

	st := r.phase(1)
	start := time.Now()
	for _, ev := range []assignment.Event{
		{Transition: assignment.Registered, TokenID: st.TokenID, RunnerUUID: "r", At: start},
		{Transition: assignment.Running, RunnerUUID: "r", At: start},
		{Transition: assignment.Completed, Result: "success", At: start.Add(90 * time.Second)},
	} {
		ev.Task, ev.Epoch, ev.Actor = 1, st.Epoch(), "facade-test"
		next, err := r.log.Apply(t.Context(), ev, nil)
		require.NoError(t, err, "%s", ev.Transition)
		st = next
	}
	eventually(t, "the job's duration", func() bool { return count("dynrunner_job_duration_seconds") == 1 })
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP dynrunner_job_duration_seconds Time from a job's start (its runner fetched the task) to its end, by tier and result (the runner's, or failed when the environment was lost), observed by the worker that watched the environment.
# TYPE dynrunner_job_duration_seconds histogram
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="1"} 0
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="5"} 0
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="15"} 0
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="30"} 0
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="60"} 0
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="120"} 1
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="300"} 1
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="600"} 1
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="1200"} 1
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="1800"} 1
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="3600"} 1
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="7200"} 1
dynrunner_job_duration_seconds_bucket{result="success",tier="pod",le="+Inf"} 1
dynrunner_job_duration_seconds_sum{result="success",tier="pod"} 90
dynrunner_job_duration_seconds_count{result="success",tier="pod"} 1
`), "dynrunner_job_duration_seconds"))
}

// TestWorkerMeasuresItsHeartbeat: every heartbeat records how long it took and how many
// environments' keys it renewed, what an operator alerts on before keys would expire.
func TestWorkerMeasuresItsHeartbeat(t *testing.T) {
	r := newRigHeartbeat(t, 100*time.Millisecond)
	reg := prometheus.NewRegistry()
	mem := newMem()
	r.runWorker(r.log, mem, podworker.Config{Actor: "worker-test", Reap: time.Hour, Heartbeat: 100 * time.Millisecond, Metrics: podworker.NewMetrics(reg)})
	one, two := r.claim(1), r.claim(2)
	eventually(t, "both environments watched", func() bool {
		return mem.watchers(fmt.Sprintf("1-%d", one.Epoch())) == 1 && mem.watchers(fmt.Sprintf("2-%d", two.Epoch())) == 1
	})
	watched := func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "dynrunner_worker_environments_watched" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	eventually(t, "a heartbeat renewing both keys", func() bool { return watched() == 2 })
	beats := func() uint64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "dynrunner_worker_heartbeat_seconds" {
				m := mf.GetMetric()[0]
				require.Equal(t, "pod", m.GetLabel()[0].GetValue(), "tier")
				return m.GetHistogram().GetSampleCount()
			}
		}
		return 0
	}
	n := beats()
	require.Positive(t, n)
	eventually(t, "more heartbeats", func() bool { return beats() > n })
}

// TestWorkerDrains: a cordoned worker with two running environments takes no new dispatch (it
// stays for another worker), reports them in flight until both end, and takes work again once
// the cordon is lifted. Killed while cordoned, it loses no job: another worker adopts its
// environment.
func TestWorkerDrains(t *testing.T) {
	r := newRigHeartbeat(t, 500*time.Millisecond)
	mem := newMem()
	nc, la := r.replica()
	a, stopA := r.startWorker(la, mem, podworker.Config{Actor: "pod-worker@a/1", Reap: time.Hour, Heartbeat: 500 * time.Millisecond})
	one, two := r.claim(1), r.claim(2)
	ids := []string{fmt.Sprintf("1-%d", one.Epoch()), fmt.Sprintf("2-%d", two.Epoch())}
	eventually(t, "both environments watched", func() bool { return mem.watchers(ids[0]) == 1 && mem.watchers(ids[1]) == 1 })

	a.SetDraining(true)
	require.True(t, a.Draining())
	r.claim(3)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		require.Equal(t, assignment.Claimed, r.phase(3).Phase, "a draining worker took a new dispatch")
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, 2, a.InFlight())
	mem.exit(ids[0], 0)
	eventually(t, "one environment left", func() bool { return a.InFlight() == 1 })
	require.Equal(t, assignment.Claimed, r.phase(3).Phase)

	// Killed while cordoned, with one environment running: another worker adopts it, and takes
	// the dispatch the drained one left.
	nc.Close()
	stopA()
	r.runWorker(r.log, mem, podworker.Config{Actor: "pod-worker@b/2", Reap: time.Hour, Heartbeat: 500 * time.Millisecond})
	eventually(t, "worker b adopts the running environment", func() bool { return mem.watchers(ids[1]) == 1 })
	eventually(t, "worker b starts the dispatch the cordoned one left", func() bool { return r.phase(3).Phase == assignment.Started })
	require.Equal(t, assignment.Started, r.phase(2).Phase, "the adopted job was lost")
}

// TestWorkerTakesWorkAgainOnceUncordoned: lifting the cordon lets the worker take new
// dispatches again.
func TestWorkerTakesWorkAgainOnceUncordoned(t *testing.T) {
	r := newRig(t)
	w, _ := r.startWorker(r.log, newMem(), podworker.Config{Actor: "worker-test", Reap: time.Hour})
	w.SetDraining(true)
	r.claim(1)
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		require.Equal(t, assignment.Claimed, r.phase(1).Phase, "a draining worker took a dispatch")
		time.Sleep(20 * time.Millisecond)
	}
	w.SetDraining(false)
	eventually(t, "started once uncordoned", func() bool { return r.phase(1).Phase == assignment.Started })
}

// TestDrainingWorkerAdoptsNothing: a draining worker takes nothing new, orphans included, so
// that it can be removed once it holds nothing. The environment of a crashed worker waits for
// a worker that takes work: here the same one, once its cordon is lifted.
func TestDrainingWorkerAdoptsNothing(t *testing.T) {
	r := newRigHeartbeat(t, 500*time.Millisecond)
	mem := newMem()
	const a, b = "pod-worker@a/1", "pod-worker@b/2"
	nc, la := r.replica()
	stopA := r.runWorker(la, mem, podworker.Config{Actor: a, Reap: time.Hour, Heartbeat: 500 * time.Millisecond})
	st := r.claim(7)
	id := fmt.Sprintf("7-%d", st.Epoch())
	eventually(t, "worker a watches its environment", func() bool { return mem.watchers(id) == 1 })

	wb, _ := r.startWorker(r.log, mem, podworker.Config{Actor: b, Reap: time.Hour, Heartbeat: 500 * time.Millisecond})
	wb.SetDraining(true)
	kv := workersBucket(t, r)
	nc.Close() // a crashes
	stopA()
	eventually(t, "a's liveness key expires", func() bool { return !liveActors(t, kv)[a] })
	assert.Never(t, func() bool { return mem.watchers(id) > 0 }, 3*time.Second, 100*time.Millisecond,
		"the draining worker adopted the crashed worker's environment")
	assert.Zero(t, wb.InFlight(), "a draining worker's in-flight count")

	wb.SetDraining(false)
	eventually(t, "worker b adopts the environment once it takes work", func() bool { return mem.watchers(id) == 1 })
	require.Equal(t, b, watcherOf(t, kv, 7, st.Epoch()), "the environment's key names")
}
