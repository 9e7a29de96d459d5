package eventlog_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// permissionsFile is the per-component users configuration operators include in their NATS
// servers; the test runs the event log against exactly it.
const permissionsFile = "../../deploy/nats/permissions.conf"

// component is one component's connection to a server configured with permissionsFile.
type component struct {
	log *eventlog.Log
	js  jetstream.JetStream

	mu      sync.Mutex
	denied  []string // permission violations the server reported
	indexed []string // failures to keep the live index
}

func (c *component) indexErrors() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.indexed, "\n")
}

func (c *component) violations() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.denied, "\n")
}

// setPasswords sets the passwords permissionsFile reads from the environment: pw-<user>, the
// user's name in lower case without the prefix (pw-vm_host for dynrunner-vm-host).
func setPasswords(t *testing.T) {
	t.Helper()
	for _, u := range []string{"SCHEDULER", "FACADE", "POD_WORKER", "VM_WORKER", "VM_HOST", "STATUS"} {
		t.Setenv("DYNRUNNER_"+u+"_PASSWORD", "pw-"+strings.ToLower(u))
	}
}

func permissionedServer(t *testing.T) *server.Server {
	t.Helper()
	setPasswords(t)
	opts, err := server.ProcessConfigFile(permissionsFile)
	require.NoError(t, err)
	return startServer(t, opts)
}

// startServer starts an in-process nats-server with JetStream on opts (its users), on a free
// loopback port and a temporary store, shut down when the test ends.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(s.Shutdown)
	return s
}

func connectAs(t *testing.T, s *server.Server, user, password string) *component {
	t.Helper()
	c, err := natsconn.Connect(natsconn.Config{URL: s.ClientURL(), User: user, Password: password, Name: user})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	comp := &component{}
	c.NC.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		comp.mu.Lock()
		defer comp.mu.Unlock()
		comp.denied = append(comp.denied, err.Error())
	})
	comp.js, err = jetstream.New(c.NC)
	require.NoError(t, err)
	cfg := eventlog.DefaultConfig()
	cfg.Key = []byte("0123456789abcdef0123456789abcdef")
	cfg.OnIndexError = func(err error) {
		comp.mu.Lock()
		defer comp.mu.Unlock()
		comp.indexed = append(comp.indexed, err.Error())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	comp.log, err = eventlog.Open(ctx, comp.js, cfg)
	require.NoError(t, err, "%s opens the event log: %s", user, comp.violations())
	return comp
}

// denied runs op, which the server must refuse, bounded by a short deadline (a refused
// publish is answered asynchronously, so the call itself only times out).
func denied(t *testing.T, c *component, what string, op func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	require.Error(t, op(ctx), what)
	require.Eventually(t, func() bool { return strings.Contains(c.violations(), "Permissions Violation") }, 5*time.Second, 10*time.Millisecond,
		"%s: the server reported no permission violation", what)
	c.mu.Lock()
	c.denied = nil
	c.mu.Unlock()
}

// TestPerComponentUsers runs one job's transitions through the event log, each component as its
// own NATS user from deploy/nats/permissions.conf, and shows what each user is refused: a pod
// worker's user cannot append a claim nor a completion, nor read a sealed task; the facade's
// cannot claim; nobody can delete a stream.
func TestPerComponentUsers(t *testing.T) {
	s := permissionedServer(t)
	sched := connectAs(t, s, "dynrunner-scheduler", "pw-scheduler") // creates the topology
	facade := connectAs(t, s, "dynrunner-facade", "pw-facade")
	pod := connectAs(t, s, "dynrunner-pod-worker", "pw-pod_worker")
	vm := connectAs(t, s, "dynrunner-vm-worker", "pw-vm_worker")
	ctx := t.Context()

	for name, c := range map[string]*component{"scheduler": sched, "facade": facade, "pod": pod, "vm": vm} {
		view := eventlog.NewView()
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = c.log.Watch(wctx, view) }()
		select {
		case <-view.Ready():
		case <-time.After(10 * time.Second):
			require.FailNow(t, "the view did not catch up", "%s: %s", name, c.violations())
		}
		require.NoError(t, c.log.Check(ctx), name)
	}

	// The scheduler claims, seals the task and dispatches.
	st, err := sched.log.Apply(ctx, claim(5), nil)
	require.NoError(t, err)
	require.NoError(t, sched.log.PutTask(ctx, 5, []byte("sealed")))
	require.NoError(t, sched.log.Dispatch(ctx, assignment.BackendPod, 5, st.Epoch()))

	// The pod worker takes the dispatch, records it, starts the environment, records its phase.
	cons, err := pod.log.Consumer(ctx, assignment.BackendPod)
	require.NoError(t, err, pod.violations())
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	require.NoError(t, err, pod.violations())
	d, err := pod.log.ParseDispatch(msg)
	require.NoError(t, err)
	require.Equal(t, st.Epoch(), d.Epoch)
	require.NoError(t, msg.Ack())
	ev := func(tr assignment.Transition) assignment.Event {
		return assignment.Event{Transition: tr, Task: 5, Epoch: st.Epoch(), At: t0.Add(time.Minute), Actor: "test",
			Handle: []byte(`{"id":"x"}`), TokenID: "tok", RunnerUUID: "r", Lease: time.Minute, Result: "success"}
	}
	for _, tr := range []assignment.Transition{assignment.Dispatched, assignment.Started} {
		st, err = pod.log.Apply(ctx, ev(tr), &st)
		require.NoError(t, err, "pod worker %s: %s", tr, pod.violations())
	}
	require.NoError(t, pod.log.RecordEnvironment(ctx, eventlog.EnvironmentRecord{Task: 5, Epoch: st.Epoch(), Backend: "docker",
		Env: "x", Phase: eventlog.EnvRunning, At: t0, Actor: "test"}), pod.violations())
	require.NoError(t, pod.log.DeadLetter(ctx, assignment.BackendPod, []byte("{}"), "test"), pod.violations())
	workers := pod.log.Workers()
	_, err = workers.Put(ctx, "env.5.1", []byte("pod-worker"))
	require.NoError(t, err, pod.violations())
	e, err := workers.Get(ctx, "env.5.1")
	require.NoError(t, err, pod.violations())
	// The heartbeat's pipelined renewals: their acknowledgements come to the worker's own inbox.
	_, errs := pod.log.WriteWorkers(ctx, []eventlog.KeyWrite{{Key: "env.5.1", Value: []byte("pod-worker"), Rev: e.Revision()}})
	require.NoError(t, errs[0], pod.violations())

	// The vm worker keeps its nonces.
	nonces := vm.log.Nonces()
	_, err = nonces.Create(ctx, "n1", []byte("sealed"))
	require.NoError(t, err, vm.violations())
	_, err = nonces.Get(ctx, "n1")
	require.NoError(t, err, vm.violations())

	// The facade reads the sealed task and records what the environment reports.
	sealed, err := facade.log.GetTask(ctx, 5)
	require.NoError(t, err, facade.violations())
	assert.Equal(t, "sealed", string(sealed))
	for _, tr := range []assignment.Transition{assignment.Registered, assignment.Running, assignment.Renewed} {
		st, err = facade.log.Apply(ctx, ev(tr), &st)
		require.NoError(t, err, "facade %s: %s", tr, facade.violations())
	}

	// What each user is refused.
	denied(t, pod, "a pod worker appends a claim", func(ctx context.Context) error {
		_, err := pod.log.Apply(ctx, claim(6), nil)
		return err
	})
	_, err = sched.log.Get(ctx, 6)
	require.ErrorIs(t, err, assignment.ErrNotFound, "the pod worker's claim was stored")
	denied(t, pod, "a pod worker appends a completion", func(ctx context.Context) error {
		_, err := pod.log.Apply(ctx, ev(assignment.Completed), &st)
		return err
	})
	denied(t, pod, "a pod worker reads a sealed task", func(ctx context.Context) error {
		_, err := pod.log.GetTask(ctx, 5)
		return err
	})
	denied(t, pod, "a pod worker writes a nonce", func(ctx context.Context) error {
		_, err := pod.log.Nonces().Put(ctx, "n2", []byte("sealed"))
		return err
	})
	denied(t, pod, "a pod worker consumes the vm tier's dispatches", func(ctx context.Context) error {
		_, err := pod.log.Consumer(ctx, assignment.BackendVM)
		return err
	})
	denied(t, pod, "a pod worker deletes the assignments stream", func(ctx context.Context) error {
		return pod.js.DeleteStream(ctx, eventlog.StreamAssignments)
	})
	denied(t, facade, "the facade appends a claim", func(ctx context.Context) error {
		_, err := facade.log.Apply(ctx, claim(7), nil)
		return err
	})
	denied(t, vm, "a vm worker appends a claim", func(ctx context.Context) error {
		_, err := vm.log.Apply(ctx, claim(8), nil)
		return err
	})
	denied(t, sched, "the scheduler renews an environment's lease", func(ctx context.Context) error {
		_, err := sched.log.Apply(ctx, ev(assignment.Renewed), &st)
		return err
	})

	// A GitHub slot: the scheduler claims it, records its runner, and what GitHub says the
	// runner did; a worker starts its environment.
	slot := assignment.SlotBase + 1
	g, err := sched.log.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: slot, At: t0, Actor: "test", Backend: assignment.BackendPod,
		Forge: assignment.ForgeGitHub, ScaleSet: 1, RunnerName: "dynrunner-pod-1", Lease: time.Hour, Pickup: time.Minute}, nil)
	require.NoError(t, err, sched.violations())
	denied(t, pod, "a pod worker configures a GitHub slot's runner", func(ctx context.Context) error {
		_, err := pod.log.Apply(ctx, assignment.Event{Transition: assignment.Configured, Task: slot, Epoch: g.Epoch(), At: t0, Actor: "test",
			RunnerID: 1, TaskDigest: "d"}, &g)
		return err
	})
	g, err = sched.log.Apply(ctx, assignment.Event{Transition: assignment.Configured, Task: slot, Epoch: g.Epoch(), At: t0, Actor: "test",
		RunnerID: 7, TaskDigest: "d"}, &g)
	require.NoError(t, err, "scheduler configured: %s", sched.violations())
	require.NoError(t, sched.log.PutTask(ctx, slot, []byte("sealed jit")), sched.violations())
	jit, err := pod.log.GetTask(ctx, slot)
	require.NoError(t, err, "a pod worker reads a slot's JIT configuration: %s", pod.violations())
	assert.Equal(t, "sealed jit", string(jit))
	_, err = vm.log.GetTask(ctx, slot)
	require.NoError(t, err, "a vm worker reads a slot's JIT configuration: %s", vm.violations())
	for _, tr := range []assignment.Transition{assignment.Dispatched, assignment.Started} {
		g, err = pod.log.Apply(ctx, assignment.Event{Transition: tr, Task: slot, Epoch: g.Epoch(), At: t0, Actor: "test", Handle: []byte(`{"id":"g"}`)}, &g)
		require.NoError(t, err, "pod worker %s: %s", tr, pod.violations())
	}
	g, err = sched.log.Apply(ctx, assignment.Event{Transition: assignment.Running, Task: slot, Epoch: g.Epoch(), At: t0, Actor: "test",
		RunnerID: 7, GitHubJob: "j1", RunID: 3, Repo: "acme/app", Job: "build"}, &g)
	require.NoError(t, err, "scheduler running: %s", sched.violations())
	_, err = sched.log.Apply(ctx, assignment.Event{Transition: assignment.Completed, Task: slot, Epoch: g.Epoch(), At: t0, Actor: "test", Result: "success"}, &g)
	require.NoError(t, err, "scheduler completed: %s", sched.violations())

	// The scheduler takes, renews and releases a lease, and claims a failure report.
	leases := sched.log.Leases()
	rev, err := leases.Create(ctx, "reconcile", []byte("scheduler@a"))
	require.NoError(t, err, sched.violations())
	rev, err = leases.Update(ctx, "reconcile", []byte("scheduler@a"), rev)
	require.NoError(t, err, sched.violations())
	_, err = leases.Get(ctx, "reconcile")
	require.NoError(t, err, sched.violations())
	require.NoError(t, leases.Delete(ctx, "reconcile", jetstream.LastRevision(rev)), sched.violations())
	f, err := sched.log.Apply(ctx, claim(9), nil)
	require.NoError(t, err)
	f, err = sched.log.Apply(ctx, assignment.Event{Transition: assignment.Failed, Task: 9, Epoch: f.Epoch(), At: t0, Actor: "test", Reason: "x"}, &f)
	require.NoError(t, err, sched.violations())
	f, err = sched.log.Apply(ctx, assignment.Event{Transition: assignment.Reporting, Task: 9, Epoch: f.Epoch(), At: t0, Actor: "test", Lease: time.Minute}, &f)
	require.NoError(t, err, sched.violations())
	_, err = sched.log.Apply(ctx, assignment.Event{Transition: assignment.Closed, Task: 9, Epoch: f.Epoch(), At: t0, Actor: "test"}, &f)
	require.NoError(t, err, sched.violations())
	denied(t, pod, "a pod worker takes the reconcile lease", func(ctx context.Context) error {
		_, err := pod.log.Leases().Create(ctx, "reconcile", []byte("pod-worker"))
		return err
	})
	denied(t, facade, "the facade takes the reconcile lease", func(ctx context.Context) error {
		_, err := facade.log.Leases().Create(ctx, "reconcile", []byte("facade"))
		return err
	})

	// The facade records the end; the scheduler drops the sealed task.
	st, err = facade.log.Apply(ctx, ev(assignment.Completed), &st)
	require.NoError(t, err, facade.violations())
	assert.Equal(t, assignment.Completed, st.Phase)
	require.NoError(t, sched.log.DropTask(ctx, 5), sched.violations())

	// Every component kept the live index for its own appends and its view; the scheduler
	// sweeps it and the sealed tasks.
	_, err = sched.log.Sweep(ctx)
	require.NoError(t, err, sched.violations())
	for name, c := range map[string]*component{"scheduler": sched, "facade": facade, "pod": pod, "vm": vm} {
		assert.Empty(t, c.indexErrors(), "%s: the live index", name)
	}
	_, err = sched.log.Live().Get(ctx, "task.5")
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the ended assignment's key")
}

// connectReader connects as a user that opens no event log (dynrunner-status).
func connectReader(t *testing.T, s *server.Server, user, password string) *component {
	t.Helper()
	c, err := natsconn.Connect(natsconn.Config{URL: s.ClientURL(), User: user, Password: password, Name: user})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	comp := &component{}
	c.NC.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		comp.mu.Lock()
		defer comp.mu.Unlock()
		comp.denied = append(comp.denied, err.Error())
	})
	comp.js, err = jetstream.New(c.NC)
	require.NoError(t, err)
	return comp
}

// TestStatusUser: every component keeps its heartbeat, under its own kind only, and the user
// dynrunner-status reads the whole fleet and the live work without a single refusal, and may
// write nothing: no heartbeat, no record, no stream, no sealed task, no dispatch.
func TestStatusUser(t *testing.T) {
	s := permissionedServer(t)
	comps := map[string]*component{
		liveness.KindScheduler: connectAs(t, s, "dynrunner-scheduler", "pw-scheduler"),
		liveness.KindFacade:    connectAs(t, s, "dynrunner-facade", "pw-facade"),
		liveness.KindPodWorker: connectAs(t, s, "dynrunner-pod-worker", "pw-pod_worker"),
		liveness.KindVMWorker:  connectAs(t, s, "dynrunner-vm-worker", "pw-vm_worker"),
	}
	ctx := t.Context()
	for kind, c := range comps {
		h, err := liveness.New(c.log.Components(), time.Minute, liveness.Record{Kind: kind, Instance: liveness.Instance("host-" + kind + "/1/ab")}, nil, zerolog.Nop())
		require.NoError(t, err)
		hctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- h.Run(hctx) }()
		t.Cleanup(func() { stop(); assert.NoError(t, <-done) })
	}
	sched := comps[liveness.KindScheduler]
	st, err := sched.log.Apply(ctx, claim(5), nil)
	require.NoError(t, err)
	require.NoError(t, sched.log.PutTask(ctx, 5, []byte("sealed")))

	status := connectReader(t, s, "dynrunner-status", "pw-status")
	var r fleet.Report
	require.Eventually(t, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err = fleet.Read(rctx, status.js, time.Now)
		return err == nil && len(r.Components) == 4
	}, 20*time.Second, 50*time.Millisecond, "the status user does not read every heartbeat")
	assert.Empty(t, r.Missing)
	assert.Equal(t, 1, r.Live.ByTierPhase[assignment.BackendPod][assignment.Claimed])
	assert.Empty(t, status.violations(), "reading the fleet")
	for kind, c := range comps {
		got, rejected, err := fleet.ReadComponents(ctx, c.js)
		require.NoError(t, err, "%s reads the fleet for its /status: %s", kind, c.violations())
		assert.Len(t, got, 4, kind)
		assert.Zero(t, rejected, kind)
		assert.Empty(t, c.violations(), "%s keeps its heartbeat and reads the others'", kind)
	}

	denied(t, comps[liveness.KindPodWorker], "a pod worker writes a scheduler's heartbeat", func(ctx context.Context) error {
		_, err := comps[liveness.KindPodWorker].log.Components().Put(ctx, "scheduler.forged", []byte("{}"))
		return err
	})
	statusKV, err := status.js.KeyValue(ctx, eventlog.BucketComponents)
	require.NoError(t, err, status.violations())
	denied(t, status, "the status user writes a heartbeat", func(ctx context.Context) error {
		_, err := statusKV.Put(ctx, "scheduler.forged", []byte("{}"))
		return err
	})
	denied(t, status, "the status user deletes a heartbeat", func(ctx context.Context) error {
		return statusKV.Delete(ctx, liveness.KindScheduler+"."+liveness.Instance("host-scheduler/1/ab"))
	})
	denied(t, status, "the status user appends a claim", func(ctx context.Context) error {
		_, err := status.js.Publish(ctx, eventlog.RecordSubject(6, assignment.Claimed), []byte("{}"))
		return err
	})
	denied(t, status, "the status user dispatches", func(ctx context.Context) error {
		_, err := status.js.Publish(ctx, eventlog.SubjectDispatch+"pod", []byte("{}"))
		return err
	})
	denied(t, status, "the status user reads a sealed task", func(ctx context.Context) error {
		_, err := status.js.KeyValue(ctx, eventlog.BucketTasks)
		return err
	})
	denied(t, status, "the status user consumes the pod tier's dispatches", func(ctx context.Context) error {
		_, err := status.js.Consumer(ctx, eventlog.StreamDispatch, "worker-pod")
		return err
	})
	denied(t, status, "the status user deletes the assignments stream", func(ctx context.Context) error {
		return status.js.DeleteStream(ctx, eventlog.StreamAssignments)
	})
	denied(t, status, "the status user deletes the pod tier's dispatch consumer", func(ctx context.Context) error {
		return status.js.DeleteConsumer(ctx, eventlog.StreamDispatch, "worker-pod")
	})
	denied(t, status, "the status user creates a stream", func(ctx context.Context) error {
		_, err := status.js.CreateStream(ctx, jetstream.StreamConfig{Name: "X", Subjects: []string{"x.>"}})
		return err
	})
	_, err = sched.log.Get(ctx, st.Task)
	require.NoError(t, err, "the assignment survived the status user")
}

// TestCordonsUsers: the scheduler's user cordons and uncordons a worker; a worker's user reads
// its cordon and cannot put or lift one (a stolen pod-worker password cannot drain the fleet,
// nor undrain itself); the status user reads cordons and writes none.
func TestCordonsUsers(t *testing.T) {
	s := permissionedServer(t)
	sched := connectAs(t, s, "dynrunner-scheduler", "pw-scheduler")
	pod := connectAs(t, s, "dynrunner-pod-worker", "pw-pod_worker")
	ctx := t.Context()
	key := liveness.KindPodWorker + "." + liveness.Instance("host-b/7/cd")
	require.NoError(t, liveness.PutCordon(ctx, sched.log.Cordons(), key, liveness.Cordon{By: "scheduler@a", At: time.Now()}))
	c, err := liveness.GetCordon(ctx, pod.log.Cordons(), key)
	require.NoError(t, err, pod.violations())
	assert.Equal(t, "scheduler@a", c.By)
	denied(t, pod, "a pod worker lifts its cordon", func(ctx context.Context) error {
		return liveness.DeleteCordon(ctx, pod.log.Cordons(), key)
	})
	denied(t, pod, "a pod worker cordons another", func(ctx context.Context) error {
		return liveness.PutCordon(ctx, pod.log.Cordons(), liveness.KindPodWorker+".other", liveness.Cordon{By: "pod"})
	})

	status := connectReader(t, s, "dynrunner-status", "pw-status")
	kv, err := status.js.KeyValue(ctx, eventlog.BucketCordons)
	require.NoError(t, err, status.violations())
	_, err = liveness.GetCordon(ctx, kv, key)
	require.NoError(t, err, status.violations())
	denied(t, status, "the status user lifts a cordon", func(ctx context.Context) error {
		return liveness.DeleteCordon(ctx, kv, key)
	})

	keys, err := sched.log.Cordons().ListKeys(ctx) // the scheduler lists cordons to sweep those of workers gone
	require.NoError(t, err, sched.violations())
	var listed []string
	for k := range keys.Keys() {
		listed = append(listed, k)
	}
	assert.Equal(t, []string{key}, listed)
	require.NoError(t, liveness.DeleteCordon(ctx, sched.log.Cordons(), key))
	_, err = liveness.GetCordon(ctx, pod.log.Cordons(), key)
	require.ErrorIs(t, err, liveness.ErrNoCordon)
	assert.Empty(t, sched.violations())
	assert.Empty(t, pod.violations())
}

// TestGitHubRerunsUsers: the scheduler's user keeps the GitHub runs to run again (create,
// compare-and-swap update, read, watch); no other user may write one (a stolen pod-worker
// password cannot make the controller rerun a workflow), and the others only look it up.
func TestGitHubRerunsUsers(t *testing.T) {
	s := permissionedServer(t)
	sched := connectAs(t, s, "dynrunner-scheduler", "pw-scheduler")
	pod := connectAs(t, s, "dynrunner-pod-worker", "pw-pod_worker")
	facade := connectAs(t, s, "dynrunner-facade", "pw-facade")
	ctx := t.Context()
	kv := sched.log.GitHubReruns()
	rev, err := kv.Create(ctx, "run.7", []byte(`{"state":"pending"}`))
	require.NoError(t, err, sched.violations())
	_, err = kv.Update(ctx, "run.7", []byte(`{"state":"asking"}`), rev)
	require.NoError(t, err, sched.violations())
	_, err = kv.Get(ctx, "run.7")
	require.NoError(t, err, sched.violations())
	w, err := kv.WatchAll(ctx)
	require.NoError(t, err, sched.violations())
	select {
	case e := <-w.Updates():
		require.NotNil(t, e, "the watch did not deliver the record")
		assert.Equal(t, "run.7", e.Key())
	case <-time.After(5 * time.Second):
		require.FailNow(t, "the scheduler's watch of the reruns delivered nothing", sched.violations())
	}
	require.NoError(t, w.Stop())
	assert.Empty(t, sched.violations())

	for name, c := range map[string]*component{"pod worker": pod, "facade": facade} {
		denied(t, c, "a "+name+" writes a rerun", func(ctx context.Context) error {
			_, err := c.log.GitHubReruns().Put(ctx, "run.8", []byte(`{"state":"pending"}`))
			return err
		})
		denied(t, c, "a "+name+" reads a rerun", func(ctx context.Context) error {
			_, err := c.log.GitHubReruns().Get(ctx, "run.7")
			return err
		})
	}
}

// TestVMHostUser: a vm host runs the vm worker and the facade in one process
// (COMPONENTS=vm-worker,facade), so it has one NATS user, dynrunner-vm-host, allowed exactly
// what the two components' users are, no more; and with it the process takes a vm dispatch,
// records the environment's start and what the environment reports, keeps its nonces and both
// components' heartbeats, and still may not claim.
func TestVMHostUser(t *testing.T) {
	setPasswords(t)
	opts, err := server.ProcessConfigFile(permissionsFile)
	require.NoError(t, err)
	perms := map[string]*server.Permissions{}
	for _, u := range opts.Users {
		perms[u.Username] = u.Permissions
	}
	allowed := func(user string) map[string]bool {
		p := perms[user]
		require.NotNil(t, p, "user %s", user)
		require.Nil(t, p.Publish.Deny, "user %s", user)
		set := map[string]bool{}
		for _, s := range p.Publish.Allow {
			set[s] = true
		}
		return set
	}
	want := allowed("dynrunner-vm-worker")
	for s := range allowed("dynrunner-facade") {
		want[s] = true
	}
	assert.Equal(t, want, allowed("dynrunner-vm-host"), "the vm host's publish permissions are the vm worker's and the facade's")
	assert.Equal(t, []string{"_INBOX_dynrunner-vm-host.>"}, perms["dynrunner-vm-host"].Subscribe.Allow)

	s := permissionedServer(t)
	sched := connectAs(t, s, "dynrunner-scheduler", "pw-scheduler")
	host := connectAs(t, s, "dynrunner-vm-host", "pw-vm_host")
	ctx := t.Context()
	view := eventlog.NewView()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = host.log.Watch(wctx, view) }()
	select {
	case <-view.Ready():
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the view did not catch up", host.violations())
	}
	for _, kind := range []string{liveness.KindVMWorker, liveness.KindFacade} {
		_, err := host.log.Components().Put(ctx, kind+"."+liveness.Instance("vm-host/1/ab"), []byte("{}"))
		require.NoError(t, err, "%s heartbeat: %s", kind, host.violations())
	}

	c := claim(5)
	c.Backend = assignment.BackendVM
	st, err := sched.log.Apply(ctx, c, nil)
	require.NoError(t, err)
	require.NoError(t, sched.log.PutTask(ctx, 5, []byte("sealed")))
	require.NoError(t, sched.log.Dispatch(ctx, assignment.BackendVM, 5, st.Epoch()))
	cons, err := host.log.Consumer(ctx, assignment.BackendVM)
	require.NoError(t, err, host.violations())
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	require.NoError(t, err, host.violations())
	require.NoError(t, msg.Ack())
	_, err = host.log.Nonces().Create(ctx, "n1", []byte("sealed"))
	require.NoError(t, err, host.violations())
	sealed, err := host.log.GetTask(ctx, 5)
	require.NoError(t, err, host.violations())
	assert.Equal(t, "sealed", string(sealed))
	for _, tr := range []assignment.Transition{assignment.Dispatched, assignment.Started, assignment.Registered, assignment.Running, assignment.Completed} {
		st, err = host.log.Apply(ctx, assignment.Event{Transition: tr, Task: 5, Epoch: st.Epoch(), At: t0.Add(time.Minute), Actor: "test",
			Handle: []byte(`{"id":"vm"}`), TokenID: "tok", RunnerUUID: "r", Result: "success"}, &st)
		require.NoError(t, err, "vm host %s: %s", tr, host.violations())
	}
	assert.Empty(t, host.indexErrors(), "the live index")

	denied(t, host, "a vm host appends a claim", func(ctx context.Context) error {
		_, err := host.log.Apply(ctx, claim(6), nil)
		return err
	})
	denied(t, host, "a vm host writes a scheduler's heartbeat", func(ctx context.Context) error {
		_, err := host.log.Components().Put(ctx, "scheduler.forged", []byte("{}"))
		return err
	})
	denied(t, host, "a vm host consumes the pod tier's dispatches", func(ctx context.Context) error {
		_, err := host.log.Consumer(ctx, assignment.BackendPod)
		return err
	})
}
