package kube_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/kube"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// testNotify checks Notify against the apiserver with Pods that no kubelet runs (no node, no
// scheduler): they stay Pending until the test writes their end into their status or deletes
// them.
func (e *env) testNotify(t *testing.T) {
	t.Run("OneWatch", e.testNotifyOneWatch)
	t.Run("Cancelled", e.testNotifyCancelled)
	t.Run("Deleted", e.testNotifyDeleted)
	t.Run("ApiserverOutage", e.testNotifyOutage)
	t.Run("StaleEventOfOlderPod", e.testNotifyStaleEvent)
}

// unscheduled returns a Backend whose Pods have no node: without a scheduler they stay Pending.
func (e *env) unscheduled(t *testing.T, client kubernetes.Interface, ns string) *kube.Backend {
	return e.newBackend(t, client, ns, func(c *kube.Config) { c.NodeName = "" })
}

// endPod writes into h's Pod status that its executor exited with code, as a kubelet does.
func (e *env) endPod(t *testing.T, ns string, h podworker.Handle, code int32) {
	t.Helper()
	pod := getPod(t, e.c, ns, h.ID)
	pod.Status.Phase = corev1.PodFailed
	if code == 0 {
		pod.Status.Phase = corev1.PodSucceeded
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name:  kube.ContainerName,
		Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error"}},
	}}
	_, err := e.c.Client.CoreV1().Pods(ns).UpdateStatus(ctxT(t), pod, metav1.UpdateOptions{})
	require.NoError(t, err, "update status of %s", h.ID)
}

// countingClient returns a client over cfg and the number of Pod watch requests it sent.
func countingClient(t *testing.T, cfg *rest.Config) (kubernetes.Interface, *atomic.Int64) {
	cfg = rest.CopyConfig(cfg)
	var watches atomic.Int64
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			if q := req.URL.Query().Get("watch"); (q == "true" || q == "1") && strings.HasSuffix(req.URL.Path, "/pods") {
				watches.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return client, &watches
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// kubeGoroutines returns the number of goroutines running a function of package kube.
func kubeGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "\ngithub.com/dynrunner/dynrunner/podworker/kube.") {
			count++
		}
	}
	return count
}

// testNotifyOneWatch registers many environments and checks that one watch, and no goroutine
// each, serves them all; then ends them and checks each gets its own exit code.
func (e *env) testNotifyOneWatch(t *testing.T) {
	const n = 30
	ns := e.c.Namespace(t)
	client, watches := countingClient(t, e.c.Config)
	b := e.unscheduled(t, client, ns)
	hs := make([]podworker.Handle, n)
	for i := range hs {
		hs[i] = startT(t, b, fakeSpec(assignment.TaskID(700+i), "forever"))
	}
	before := kubeGoroutines()
	chs := make([]<-chan podworkertest.Ended, n)
	chs[0] = podworkertest.Notified(t, ctxT(t), b, hs[0])
	pollT(t, "the shared watch", func() bool { return watches.Load() > 0 })
	first := watches.Load()
	for i := 1; i < n; i++ {
		chs[i] = podworkertest.Notified(t, ctxT(t), b, hs[i])
	}
	// Nothing has ended: the registrations are served, with no goroutine of their own.
	for i, ch := range chs {
		podworkertest.RequireNoEnd(t, ch, hs[i].ID)
	}
	assert.LessOrEqual(t, kubeGoroutines()-before, 3, "goroutines of package kube with %d environments registered", n)
	for i, h := range hs {
		e.endPod(t, ns, h, int32(i))
	}
	for i, ch := range chs {
		got := podworkertest.Receive(t, testTimeout, ch, hs[i].ID)
		require.NoError(t, got.Err, "Notify(%s)", hs[i].ID)
		assert.Equal(t, i, got.Exit.Code, "Notify(%s) = %+v", hs[i].ID, got.Exit)
	}
	assert.Equal(t, first, watches.Load(), "Pod watches sent for %d registrations", n)

	// Ended Pods are reported at once by a fresh informer, which stops with the last one.
	pollT(t, "the informer stopped", func() bool { return kubeGoroutines() <= before })
	got := podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctxT(t), b, hs[3]), "ended "+hs[3].ID)
	require.NoError(t, got.Err)
	assert.Equal(t, podworker.Exit{Code: 3, Reason: "exited"}, got.Exit)
	pollT(t, "the informer stopped", func() bool { return kubeGoroutines() <= before })
}

// errStopped is the cause testNotifyCancelled stops registrations with.
var errStopped = errors.New("kube_test: registration stopped")

// notifyStop registers h with b.Notify, as podworkertest.Notified does, and returns the
// registration's stop.
func notifyStop(t *testing.T, b *kube.Backend, h podworker.Handle) (<-chan podworkertest.Ended, func(error)) {
	var stop func(error)
	ch := podworkertest.Ends(t, h, func(ended func(podworker.Exit, error)) { stop = b.Notify(h, ended) })
	return ch, stop
}

// testNotifyCancelled checks a registration that is stopped: ended gets the stop's cause as
// it is, once, and the Pod and another registration of it are left alone; stopping again, or
// after the end, does nothing.
func (e *env) testNotifyCancelled(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.unscheduled(t, e.c.Client, ns)
	h := startT(t, b, fakeSpec(801, "forever"))
	ch, stop := notifyStop(t, b, h)
	other, stopOther := notifyStop(t, b, h) // a second registration of the same Pod
	podworkertest.RequireNoEnd(t, ch, h.ID)
	stop(errStopped)
	stop(context.Canceled) // does nothing
	got := podworkertest.Receive(t, testTimeout, ch, h.ID)
	require.ErrorIs(t, got.Err, errStopped, "Notify after stop = %+v", got.Exit)
	assert.Equal(t, podworker.Exit{}, got.Exit, "Notify after stop")
	podworkertest.RequireNoEnd(t, other, "the other registration")
	assert.Equal(t, corev1.PodPending, getPod(t, e.c, ns, h.ID).Status.Phase, "the Pod after the stop")

	// Stopped at once, before the informer has looked it up.
	at, stopAt := notifyStop(t, b, h)
	stopAt(errStopped)
	got = podworkertest.Receive(t, testTimeout, at, "stopped at once")
	require.ErrorIs(t, got.Err, errStopped, "Notify stopped at once = %+v", got.Exit)

	e.endPod(t, ns, h, 0)
	got = podworkertest.Receive(t, testTimeout, other, "the other registration")
	require.NoError(t, got.Err)
	assert.Equal(t, podworker.Exit{Code: 0, Reason: "exited"}, got.Exit)
	stopOther(errStopped) // after the end: does nothing (Ends fails t on a second end)
	stop(errStopped)
	podworkertest.RequireNoEnd(t, other, "the other registration after its stop")
	podworkertest.RequireNoEnd(t, ch, h.ID+" after a second stop")

	// A bad handle is reported at once; its stop does nothing.
	bad := podworker.Handle{Backend: "docker", ID: h.ID}
	badCh, stopBad := notifyStop(t, b, bad)
	got = podworkertest.Receive(t, testTimeout, badCh, "a bad handle")
	require.ErrorIs(t, got.Err, kube.ErrInvalidHandle, "Notify on a bad handle = %+v", got.Exit)
	stopBad(errStopped)
}

// testNotifyDeleted checks a Pod deleted while registered, one gone before Notify, and one
// replaced by a newer Pod of the same name.
func (e *env) testNotifyDeleted(t *testing.T) {
	ns := e.c.Namespace(t)
	obs := &phaseLog{got: map[string][]kube.PhaseChange{}}
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.NodeName = ""; c.OnPhase = obs.observe })
	h := startT(t, b, fakeSpec(802, "forever"))
	ch := podworkertest.Notified(t, ctxT(t), b, h)
	// Registrations are looked up in order once the informer synced: when a Pod that never
	// existed is reported gone, h has been looked up, so its deletion below reaches it
	// through the watch.
	never := podworker.Handle{Backend: "kubernetes", ID: "dynrunner-899-1", Task: 899, Epoch: 1}
	got := podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctxT(t), b, never), never.ID)
	require.ErrorIs(t, got.Err, podworker.ErrNotFound, "Notify on a Pod that never existed = %+v", got.Exit)
	pollT(t, "Pending reported", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return len(obs.got[h.ID]) > 0
	})
	require.NoError(t, e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), h.ID, metav1.DeleteOptions{}))
	got = podworkertest.Receive(t, testTimeout, ch, h.ID)
	require.ErrorIs(t, got.Err, podworker.ErrNotFound, "Notify = %+v", got.Exit)
	assert.Equal(t, podworker.Exit{Code: -1, Reason: "deleted"}, got.Exit)
	obs.mu.Lock()
	changes := obs.got[h.ID]
	obs.mu.Unlock()
	require.Len(t, changes, 2, "phases %+v", changes)
	assert.Equal(t, string(corev1.PodPending), changes[0].Phase)
	assert.Equal(t, kube.PhaseDeleted, changes[1].Phase)
	assert.Equal(t, h.Data["pod_uid"], changes[1].UID)
	// The registration was the informer's last: its phases still had a live ctx.
	obs.requireLiveCtx(t, h)

	got = podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctxT(t), b, h), "gone "+h.ID)
	require.ErrorIs(t, got.Err, podworker.ErrNotFound, "Notify on a gone Pod = %+v", got.Exit)

	// A newer Pod of the same name: the old handle's is gone.
	h2 := startT(t, b, fakeSpec(802, "forever"))
	require.NotEqual(t, h.Data["pod_uid"], h2.Data["pod_uid"])
	got = podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctxT(t), b, h), "replaced "+h.ID)
	require.ErrorIs(t, got.Err, podworker.ErrNotFound, "Notify on a replaced Pod = %+v", got.Exit)
	ch2 := podworkertest.Notified(t, ctxT(t), b, h2)
	podworkertest.RequireNoEnd(t, ch2, h2.ID)
}

// testNotifyOutage cuts the backend off the apiserver while environments are registered:
// nothing is reported while it is unreachable, even for Pods that ended or were deleted
// meanwhile, and both are reported once it is back.
func (e *env) testNotifyOutage(t *testing.T) {
	ns := e.c.Namespace(t)
	p := startProxy(t, strings.TrimPrefix(e.c.Config.Host, "https://"))
	cfg := rest.CopyConfig(e.c.Config)
	cfg.Host = "https://" + p.addr()
	client, watches := countingClient(t, cfg)
	b := e.unscheduled(t, client, ns)
	ended := startT(t, b, fakeSpec(811, "forever"))
	gone := startT(t, b, fakeSpec(812, "forever"))
	endedCh := podworkertest.Notified(t, ctxT(t), b, ended)
	goneCh := podworkertest.Notified(t, ctxT(t), b, gone)
	pollT(t, "the shared watch", func() bool { return watches.Load() > 0 })

	p.cut()
	pollT(t, "the backend trying to reconnect", func() bool { return p.refused.Load() >= 2 })
	e.endPod(t, ns, ended, 7)
	require.NoError(t, e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), gone.ID, metav1.DeleteOptions{}))
	refused := p.refused.Load()
	pollT(t, "another reconnect attempt", func() bool { return p.refused.Load() > refused })
	podworkertest.RequireNoEnd(t, endedCh, ended.ID)
	podworkertest.RequireNoEnd(t, goneCh, gone.ID)

	p.restore()
	got := podworkertest.Receive(t, testTimeout, endedCh, ended.ID)
	require.NoError(t, got.Err)
	assert.Equal(t, podworker.Exit{Code: 7, Reason: "exited"}, got.Exit)
	got = podworkertest.Receive(t, testTimeout, goneCh, gone.ID)
	require.ErrorIs(t, got.Err, podworker.ErrNotFound, "Notify = %+v", got.Exit)
}

// proxy forwards TCP connections to the apiserver until cut: then it drops every connection
// and refuses new ones until restored, as an apiserver that restarts or a broken network.
type proxy struct {
	ln      net.Listener
	target  string
	refused atomic.Int64
	mu      sync.Mutex
	down    bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(c) })
	}
}

func (p *proxy) pipe(c net.Conn) {
	defer p.forget(c)
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		_ = u.Close()
		return
	}
	p.conns[u] = struct{}{}
	p.mu.Unlock()
	defer p.forget(u)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(u, c)
		_ = u.Close()
		close(done)
	}()
	_, _ = io.Copy(c, u)
	_ = c.Close()
	<-done
}

func (p *proxy) forget(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// cut drops every connection and refuses new ones.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// restore accepts connections again.
func (p *proxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// testNotifyStaleEvent: events of an older Pod of the same name that the informer still
// delivers (Start deleted it and created the handle's) do not end the handle's registration:
// the apiserver's current Pod of the name is looked up, and it is the handle's.
func (e *env) testNotifyStaleEvent(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.unscheduled(t, e.c.Client, ns)
	// A registration that keeps the informer running throughout.
	keeper := startT(t, b, fakeSpec(810, "forever"))
	keeperCh := podworkertest.Notified(t, ctxT(t), b, keeper)

	old := startT(t, b, fakeSpec(811, "forever"))
	oldPod := getPod(t, e.c, ns, old.ID)
	oldCh := podworkertest.Notified(t, ctxT(t), b, old)
	require.NoError(t, e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), old.ID, metav1.DeleteOptions{}))
	got := podworkertest.Receive(t, testTimeout, oldCh, "deleted "+old.ID)
	require.ErrorIs(t, got.Err, podworker.ErrNotFound, "Notify of the deleted Pod = %+v", got.Exit)

	h := startT(t, b, fakeSpec(811, "forever")) // the same name, a new Pod
	require.NotEqual(t, old.Data["pod_uid"], h.Data["pod_uid"])
	ch := podworkertest.Notified(t, ctxT(t), b, h)
	require.True(t, kube.DeliverPodEvent(b, oldPod, false), "no informer runs")
	require.True(t, kube.DeliverPodEvent(b, oldPod, true), "no informer runs")
	// Registrations are looked up in order: once a Pod that never existed is reported gone,
	// h's look-up after the stale events is done too.
	never := podworker.Handle{Backend: "kubernetes", ID: "dynrunner-898-1", Task: 898, Epoch: 1}
	got = podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctxT(t), b, never), never.ID)
	require.ErrorIs(t, got.Err, podworker.ErrNotFound, "Notify on a Pod that never existed = %+v", got.Exit)
	podworkertest.RequireNoEnd(t, ch, h.ID)
	podworkertest.RequireNoEnd(t, keeperCh, keeper.ID)

	// The handle's own end is still reported.
	e.endPod(t, ns, h, 3)
	got = podworkertest.Receive(t, testTimeout, ch, h.ID)
	require.NoError(t, got.Err)
	assert.Equal(t, 3, got.Exit.Code, "exit %+v", got.Exit)
}
