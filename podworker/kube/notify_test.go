package kube_test

import (
	"context"
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

// notified is the outcome of one Notify.
type notified struct {
	exit podworker.Exit
	err  error
}

// notifyT registers h with b.Notify; the channel delivers what ended got, and the test fails
// if ended is called more than once.
func notifyT(t *testing.T, ctx context.Context, b *kube.Backend, h podworker.Handle) <-chan notified {
	ch := make(chan notified, 1)
	var calls atomic.Int32
	b.Notify(ctx, h, func(exit podworker.Exit, err error) {
		if calls.Add(1) > 1 {
			t.Errorf("the end of %s was reported more than once", h.ID)
			return
		}
		ch <- notified{exit, err}
	})
	return ch
}

// receiveT returns what ch delivers, failing the test after testTimeout.
func receiveT(t *testing.T, what string, ch <-chan notified) notified {
	t.Helper()
	select {
	case n := <-ch:
		return n
	case <-ctxT(t).Done():
		t.Fatalf("%s: not notified within %v", what, testTimeout)
		return notified{}
	}
}

// requireNotNotified fails the test if ch already delivered.
func requireNotNotified(t *testing.T, what string, ch <-chan notified) {
	t.Helper()
	select {
	case n := <-ch:
		t.Fatalf("%s: notified %+v, %v while it still runs", what, n.exit, n.err)
	default:
	}
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
	chs := make([]<-chan notified, n)
	chs[0] = notifyT(t, ctxT(t), b, hs[0])
	pollT(t, "the shared watch", func() bool { return watches.Load() > 0 })
	first := watches.Load()
	for i := 1; i < n; i++ {
		chs[i] = notifyT(t, ctxT(t), b, hs[i])
	}
	// Nothing has ended: the registrations are served, with no goroutine of their own.
	for i, ch := range chs {
		requireNotNotified(t, hs[i].ID, ch)
	}
	assert.LessOrEqual(t, kubeGoroutines()-before, 3, "goroutines of package kube with %d environments registered", n)
	for i, h := range hs {
		e.endPod(t, ns, h, int32(i))
	}
	for i, ch := range chs {
		got := receiveT(t, hs[i].ID, ch)
		require.NoError(t, got.err, "Notify(%s)", hs[i].ID)
		assert.Equal(t, i, got.exit.Code, "Notify(%s) = %+v", hs[i].ID, got.exit)
	}
	assert.Equal(t, first, watches.Load(), "Pod watches sent for %d registrations", n)

	// Ended Pods are reported at once by a fresh informer, which stops with the last one.
	pollT(t, "the informer stopped", func() bool { return kubeGoroutines() <= before })
	got := receiveT(t, "ended "+hs[3].ID, notifyT(t, ctxT(t), b, hs[3]))
	require.NoError(t, got.err)
	assert.Equal(t, podworker.Exit{Code: 3, Reason: "exited"}, got.exit)
	pollT(t, "the informer stopped", func() bool { return kubeGoroutines() <= before })
}

// testNotifyCancelled checks a registration whose ctx is cancelled: ended says so, once, and
// the Pod is left alone.
func (e *env) testNotifyCancelled(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.unscheduled(t, e.c.Client, ns)
	h := startT(t, b, fakeSpec(801, "forever"))
	ctx, cancel := context.WithCancel(ctxT(t))
	ch := notifyT(t, ctx, b, h)
	other := notifyT(t, ctxT(t), b, h) // a second registration of the same Pod
	requireNotNotified(t, h.ID, ch)
	cancel()
	got := receiveT(t, h.ID, ch)
	require.ErrorIs(t, got.err, context.Canceled, "Notify after cancel = %+v", got.exit)
	requireNotNotified(t, "the other registration", other)
	assert.Equal(t, corev1.PodPending, getPod(t, e.c, ns, h.ID).Status.Phase, "the Pod after the cancel")

	done, cancelDone := context.WithCancel(ctxT(t))
	cancelDone()
	got = receiveT(t, "done ctx", notifyT(t, done, b, h))
	require.ErrorIs(t, got.err, context.Canceled, "Notify with a done ctx = %+v", got.exit)

	e.endPod(t, ns, h, 0)
	got = receiveT(t, "the other registration", other)
	require.NoError(t, got.err)
	assert.Equal(t, podworker.Exit{Code: 0, Reason: "exited"}, got.exit)
}

// testNotifyDeleted checks a Pod deleted while registered, one gone before Notify, and one
// replaced by a newer Pod of the same name.
func (e *env) testNotifyDeleted(t *testing.T) {
	ns := e.c.Namespace(t)
	obs := &phaseLog{got: map[string][]kube.PhaseChange{}}
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.NodeName = ""; c.OnPhase = obs.observe })
	h := startT(t, b, fakeSpec(802, "forever"))
	ch := notifyT(t, ctxT(t), b, h)
	// Registrations are looked up in order once the informer synced: when a Pod that never
	// existed is reported gone, h has been looked up, so its deletion below reaches it
	// through the watch.
	never := podworker.Handle{Backend: "kubernetes", ID: "dynrunner-899-1", Task: 899, Epoch: 1}
	got := receiveT(t, never.ID, notifyT(t, ctxT(t), b, never))
	require.ErrorIs(t, got.err, podworker.ErrNotFound, "Notify on a Pod that never existed = %+v", got.exit)
	pollT(t, "Pending reported", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return len(obs.got[h.ID]) > 0
	})
	require.NoError(t, e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), h.ID, metav1.DeleteOptions{}))
	got = receiveT(t, h.ID, ch)
	require.ErrorIs(t, got.err, podworker.ErrNotFound, "Notify = %+v", got.exit)
	assert.Equal(t, podworker.Exit{Code: -1, Reason: "deleted"}, got.exit)
	obs.mu.Lock()
	changes := obs.got[h.ID]
	obs.mu.Unlock()
	require.Len(t, changes, 2, "phases %+v", changes)
	assert.Equal(t, string(corev1.PodPending), changes[0].Phase)
	assert.Equal(t, kube.PhaseDeleted, changes[1].Phase)
	assert.Equal(t, h.Data["pod_uid"], changes[1].UID)

	got = receiveT(t, "gone "+h.ID, notifyT(t, ctxT(t), b, h))
	require.ErrorIs(t, got.err, podworker.ErrNotFound, "Notify on a gone Pod = %+v", got.exit)

	// A newer Pod of the same name: the old handle's is gone.
	h2 := startT(t, b, fakeSpec(802, "forever"))
	require.NotEqual(t, h.Data["pod_uid"], h2.Data["pod_uid"])
	got = receiveT(t, "replaced "+h.ID, notifyT(t, ctxT(t), b, h))
	require.ErrorIs(t, got.err, podworker.ErrNotFound, "Notify on a replaced Pod = %+v", got.exit)
	ch2 := notifyT(t, ctxT(t), b, h2)
	requireNotNotified(t, h2.ID, ch2)
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
	endedCh := notifyT(t, ctxT(t), b, ended)
	goneCh := notifyT(t, ctxT(t), b, gone)
	pollT(t, "the shared watch", func() bool { return watches.Load() > 0 })

	p.cut()
	pollT(t, "the backend trying to reconnect", func() bool { return p.refused.Load() >= 2 })
	e.endPod(t, ns, ended, 7)
	require.NoError(t, e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), gone.ID, metav1.DeleteOptions{}))
	refused := p.refused.Load()
	pollT(t, "another reconnect attempt", func() bool { return p.refused.Load() > refused })
	requireNotNotified(t, ended.ID, endedCh)
	requireNotNotified(t, gone.ID, goneCh)

	p.restore()
	got := receiveT(t, ended.ID, endedCh)
	require.NoError(t, got.err)
	assert.Equal(t, podworker.Exit{Code: 7, Reason: "exited"}, got.exit)
	got = receiveT(t, gone.ID, goneCh)
	require.ErrorIs(t, got.err, podworker.ErrNotFound, "Notify = %+v", got.exit)
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
	keeperCh := notifyT(t, ctxT(t), b, keeper)

	old := startT(t, b, fakeSpec(811, "forever"))
	oldPod := getPod(t, e.c, ns, old.ID)
	oldCh := notifyT(t, ctxT(t), b, old)
	require.NoError(t, e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), old.ID, metav1.DeleteOptions{}))
	got := receiveT(t, "deleted "+old.ID, oldCh)
	require.ErrorIs(t, got.err, podworker.ErrNotFound, "Notify of the deleted Pod = %+v", got.exit)

	h := startT(t, b, fakeSpec(811, "forever")) // the same name, a new Pod
	require.NotEqual(t, old.Data["pod_uid"], h.Data["pod_uid"])
	ch := notifyT(t, ctxT(t), b, h)
	require.True(t, kube.DeliverPodEvent(b, oldPod, false), "no informer runs")
	require.True(t, kube.DeliverPodEvent(b, oldPod, true), "no informer runs")
	// Registrations are looked up in order: once a Pod that never existed is reported gone,
	// h's look-up after the stale events is done too.
	never := podworker.Handle{Backend: "kubernetes", ID: "dynrunner-898-1", Task: 898, Epoch: 1}
	got = receiveT(t, never.ID, notifyT(t, ctxT(t), b, never))
	require.ErrorIs(t, got.err, podworker.ErrNotFound, "Notify on a Pod that never existed = %+v", got.exit)
	requireNotNotified(t, h.ID, ch)
	requireNotNotified(t, keeper.ID, keeperCh)

	// The handle's own end is still reported.
	e.endPod(t, ns, h, 3)
	got = receiveT(t, h.ID, ch)
	require.NoError(t, got.err)
	assert.Equal(t, 3, got.exit.Code, "exit %+v", got.exit)
}
