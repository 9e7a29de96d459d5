package docker_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/docker"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// streamGoroutines counts the goroutines that follow an event stream of a Backend.
func streamGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "podworker/docker.(*notifier).run(") {
			n++
		}
	}
	return n
}

// stopContainer stops container id at once (SIGKILL), behind the backend's back.
func stopContainer(t *testing.T, id string) {
	t.Helper()
	code, err := engineJSON(ctxT(t), http.MethodPost, "/containers/"+id+"/stop?t=0", nil, nil)
	require.NoError(t, err, "stop %s", id)
	require.Contains(t, []int{http.StatusNoContent, http.StatusNotModified}, code, "stop %s", id)
}

// TestNotifyOneStream: several environments are served by one subscription to the engine's
// event stream and one goroutine, whose ends are each reported once; the stream stops with the
// last registration.
func TestNotifyOneStream(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	before := streamGoroutines()
	const n = 3
	var hs [n]podworker.Handle
	var ends [n]<-chan podworkertest.Ended
	for i := range n {
		hs[i] = startT(t, b, fakeSpec(assignment.TaskID(50+i), "forever"))
		ends[i] = podworkertest.Notified(t, ctxT(t), b, hs[i])
	}
	require.Eventually(t, func() bool { return docker.EventSubscriptions(b) >= 1 }, testTimeout, 10*time.Millisecond, "no subscription")
	for i := range n {
		podworkertest.RequireNoEnd(t, ends[i], hs[i].ID)
	}
	assert.EqualValues(t, 1, docker.EventSubscriptions(b), "subscriptions for %d environments", n)
	assert.Equal(t, 1, streamGoroutines()-before, "goroutines following the event stream for %d environments", n)

	// One ends by itself, behind the backend's back; the others are destroyed.
	stopContainer(t, hs[0].Data["container_id"])
	e := podworkertest.Receive(t, testTimeout, ends[0], "stopped")
	require.NoError(t, e.Err, "stopped")
	want, err := b.Wait(ctxT(t), hs[0])
	require.NoError(t, err, "Wait")
	assert.Equal(t, want, e.Exit, "Notify, against Wait")
	assert.Equal(t, "exited", e.Exit.Reason, "stopped")
	assert.NotZero(t, e.Exit.Code, "stopped")
	for i := 1; i < n; i++ {
		require.NoError(t, b.Destroy(ctxT(t), hs[i]))
		e := podworkertest.Receive(t, testTimeout, ends[i], hs[i].ID)
		assert.NoError(t, e.Err, "destroyed %s", hs[i].ID)
		assert.Equal(t, "exited", e.Exit.Reason, "destroyed %s", hs[i].ID)
	}
	assert.Eventually(t, func() bool { return !docker.EventsRunning(b) && streamGoroutines() == before },
		testTimeout, 10*time.Millisecond, "the event stream runs on with no registration")
	assert.EqualValues(t, 1, docker.EventSubscriptions(b), "subscriptions")
}

// errStopped is the cause the tests stop registrations with.
var errStopped = errors.New("docker test: registration stopped")

// TestNotifyStopped: a stopped registration is reported with the stop's cause, as it is, and the
// environment runs on; stopping it again, or after its end, does nothing; a registration
// stopped right after Notify is reported at once, and a nil cause as context.Canceled.
func TestNotifyStopped(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	h := startT(t, b, fakeSpec(60, "forever"))
	var stop func(error)
	ch := podworkertest.Ends(t, h, func(ended func(podworker.Exit, error)) { stop = b.Notify(h, ended) })
	require.Eventually(t, func() bool { return docker.EventSubscriptions(b) == 1 }, testTimeout, 10*time.Millisecond, "no subscription")
	podworkertest.RequireNoEnd(t, ch, h.ID)
	stop(errStopped)
	stop(context.Canceled) // reported once (Ends fails the test otherwise), with the first cause
	e := podworkertest.Receive(t, testTimeout, ch, "stopped")
	assert.ErrorIs(t, e.Err, errStopped, "Notify after its stop = %+v", e.Exit)
	assert.Same(t, errStopped, e.Err, "the stop's cause, as it is")
	assert.Eventually(t, func() bool { return !docker.EventsRunning(b) }, testTimeout, 10*time.Millisecond, "the event stream runs on with no registration")

	short, cancelShort := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancelShort()
	_, err := b.Wait(short, h)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the environment stopped with its registration")

	ch = podworkertest.Ends(t, h, func(ended func(podworker.Exit, error)) { b.Notify(h, ended)(errStopped) })
	e = podworkertest.Receive(t, testTimeout, ch, "stopped right after Notify")
	assert.ErrorIs(t, e.Err, errStopped, "Notify stopped at once = %+v", e.Exit)

	ch = podworkertest.Ends(t, h, func(ended func(podworker.Exit, error)) { b.Notify(h, ended)(nil) })
	e = podworkertest.Receive(t, testTimeout, ch, "stopped with no cause")
	assert.ErrorIs(t, e.Err, context.Canceled, "Notify stopped with a nil cause = %+v", e.Exit)

	// Stopping after the end does nothing.
	var stopEnded func(error)
	ch = podworkertest.Ends(t, h, func(ended func(podworker.Exit, error)) { stopEnded = b.Notify(h, ended) })
	require.NoError(t, b.Destroy(ctxT(t), h))
	e = podworkertest.Receive(t, testTimeout, ch, "destroyed")
	require.NoError(t, e.Err, "destroyed")
	stopEnded(errStopped)
	podworkertest.RequireNoEnd(t, ch, "stopped after its end")
}

// TestNotifyRemoved: a container removed while registered reports its exit, as Wait does when
// the container is removed right after it stopped; one already gone reports ErrNotFound; one
// that already exited reports its exit at once.
func TestNotifyRemoved(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	h := startT(t, b, fakeSpec(61, "forever"))
	ch := podworkertest.Notified(t, ctxT(t), b, h)
	require.Eventually(t, func() bool { return docker.EventSubscriptions(b) == 1 }, testTimeout, 10*time.Millisecond, "no subscription")
	podworkertest.RequireNoEnd(t, ch, h.ID)
	code, err := engineJSON(ctxT(t), http.MethodDelete, "/containers/"+h.Data["container_id"]+"?force=1", nil, nil)
	require.NoError(t, err, "remove")
	require.Equal(t, http.StatusNoContent, code, "remove")
	e := podworkertest.Receive(t, testTimeout, ch, "removed")
	require.NoError(t, e.Err, "removed while registered")
	assert.Equal(t, podworker.Exit{Code: 137, Reason: "exited"}, e.Exit, "removed while registered")

	e = podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctxT(t), b, h), "gone before Notify")
	assert.ErrorIs(t, e.Err, podworker.ErrNotFound, "Notify of a removed container = %+v", e.Exit)
	_, err = b.Wait(ctxT(t), h)
	assert.ErrorIs(t, err, podworker.ErrNotFound, "Wait of a removed container")

	exited := startT(t, b, fakeSpec(62, "exit3"))
	want := waitT(t, b, exited)
	e = podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctxT(t), b, exited), "exited before Notify")
	require.NoError(t, e.Err, "exited before Notify")
	assert.Equal(t, want, e.Exit, "Notify, against Wait")
}

// TestNotifyReconnects: when the event stream breaks, the backend subscribes again and then
// inspects every registered container, so an end while it was not subscribed is reported, and
// ends after it come through the new subscription.
func TestNotifyReconnects(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	// The second subscription waits until the test let it.
	hold := make(chan struct{})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) }) // before b.Close
	var subscribing atomic.Int32
	docker.SetBeforeSubscribe(b, func() {
		if subscribing.Add(1) == 2 {
			<-hold
		}
	})
	stays := startT(t, b, fakeSpec(63, "forever"))
	stops := startT(t, b, fakeSpec(64, "forever"))
	staysEnd := podworkertest.Notified(t, ctxT(t), b, stays)
	stopsEnd := podworkertest.Notified(t, ctxT(t), b, stops)
	require.Eventually(t, func() bool { return docker.HangUpEvents(b) }, testTimeout, 10*time.Millisecond, "never subscribed")
	require.Eventually(t, func() bool { return subscribing.Load() == 2 }, testTimeout, 10*time.Millisecond, "no second subscription")

	stopContainer(t, stops.Data["container_id"])
	podworkertest.RequireNoEnd(t, stopsEnd, "not subscribed")
	release.Do(func() { close(hold) })
	e := podworkertest.Receive(t, testTimeout, stopsEnd, "stopped while not subscribed")
	require.NoError(t, e.Err, "stopped while not subscribed")
	want, err := b.Wait(ctxT(t), stops)
	require.NoError(t, err, "Wait")
	assert.Equal(t, want, e.Exit, "Notify, against Wait")
	podworkertest.RequireNoEnd(t, staysEnd, stays.ID)

	require.NoError(t, b.Destroy(ctxT(t), stays))
	e = podworkertest.Receive(t, testTimeout, staysEnd, "destroyed after the reconnection")
	assert.NoError(t, e.Err, "destroyed after the reconnection")
	assert.EqualValues(t, 2, docker.EventSubscriptions(b), "subscriptions")
}

// TestNotifyUnreachableEngine: while the engine cannot be reached, a registration is not
// reported lost; it ends with its stop (here when the context of Notified ends).
func TestNotifyUnreachableEngine(t *testing.T) {
	b := newBackend(t, "sha256:"+strings.Repeat("ab", 32), t.TempDir(), testScope(t), func(c *docker.Config) {
		c.Socket = filepath.Join(t.TempDir(), "absent.sock")
	})
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	h := podworker.Handle{Backend: "docker", ID: "dynrunner-5-1", Task: 5, Epoch: 1}
	e := podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctx, b, h), "unreachable engine")
	assert.ErrorIs(t, e.Err, context.DeadlineExceeded, "Notify with the engine unreachable waits until the context ends")
	require.NoError(t, b.Close())
	assert.Zero(t, streamGoroutines(), "goroutines following the event stream after Close")
}

// TestNotifyRejectsBadHandles: Notify refuses what Wait refuses.
func TestNotifyRejectsBadHandles(t *testing.T) {
	b := newBackend(t, "sha256:"+strings.Repeat("ab", 32), t.TempDir(), testScope(t), nil)
	bad := podworker.Handle{Backend: "docker", ID: "../etc"}
	var stop func(error)
	ch := podworkertest.Ends(t, bad, func(ended func(podworker.Exit, error)) { stop = b.Notify(bad, ended) })
	e := podworkertest.Receive(t, testTimeout, ch, "bad handle")
	assert.ErrorIs(t, e.Err, docker.ErrInvalidHandle, "Notify of a bad handle")
	stop(errStopped) // does nothing: reported already
	podworkertest.RequireNoEnd(t, ch, "bad handle stopped after its end")
}

// TestNotifyRemovedBeforeInspection: a container removed before the inspection its die event
// triggered reports the exit code of that event, as Wait reports the code of its wait when the
// container is gone by the inspection.
func TestNotifyRemovedBeforeInspection(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	// The inspection after the die event waits until the container is removed.
	hold := make(chan struct{})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) }) // before b.Close
	docker.SetBeforeInspect(b, func(i int64) {
		if i == 2 {
			<-hold
		}
	})
	h := startT(t, b, fakeSpec(65, "forever"))
	ch := podworkertest.Notified(t, ctxT(t), b, h)
	// The first inspection, once subscribed, finds it running.
	require.Eventually(t, func() bool { return docker.Inspections(b) == 1 && !docker.Inspecting(b) }, testTimeout, 10*time.Millisecond, "no inspection after subscribing")
	podworkertest.RequireNoEnd(t, ch, h.ID)
	code, err := engineJSON(ctxT(t), http.MethodDelete, "/containers/"+h.Data["container_id"]+"?force=1", nil, nil)
	require.NoError(t, err, "remove")
	require.Equal(t, http.StatusNoContent, code, "remove")
	release.Do(func() { close(hold) })
	e := podworkertest.Receive(t, testTimeout, ch, "removed")
	require.NoError(t, e.Err, "removed before the inspection")
	assert.Equal(t, podworker.Exit{Code: 137, Reason: "exited"}, e.Exit, "removed before the inspection: the die event's code")
}

// socketProxy serves the engine's API on a unix socket of its own, as a socket proxy does;
// events, when not nil, answers GET /events instead of the engine.
func socketProxy(t *testing.T, events func(w http.ResponseWriter, r *http.Request, engine http.Handler)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "http", "docker"
		},
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", docker.DefaultSocket)
		}},
		FlushInterval: -1, // the event stream as it comes
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if events != nil && strings.HasSuffix(r.URL.Path, "/events") {
			events(w, r, proxy)
			return
		}
		proxy.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

// TestNotifyLostEvent: the engine drops events a slow subscriber does not take in time; a
// die event lost so still ends the registration, at the next inspection of every registered
// container. Here a proxy keeps the event stream open but passes no event.
func TestNotifyLostEvent(t *testing.T) {
	image := testImage(t)
	sock := socketProxy(t, func(w http.ResponseWriter, r *http.Request, _ http.Handler) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	b := newBackend(t, image, t.TempDir(), testScope(t), func(c *docker.Config) { c.Socket = sock })
	docker.SetRecheck(b, 500*time.Millisecond)
	h := startT(t, b, fakeSpec(72, "forever"))
	ch := podworkertest.Notified(t, ctxT(t), b, h)
	require.Eventually(t, func() bool { return docker.Inspections(b) >= 1 && !docker.Inspecting(b) }, testTimeout, 10*time.Millisecond, "no inspection after subscribing")
	podworkertest.RequireNoEnd(t, ch, h.ID)
	stopContainer(t, h.Data["container_id"])
	e := podworkertest.Receive(t, testTimeout, ch, "stopped, its die event lost")
	require.NoError(t, e.Err, "stopped")
	want, err := b.Wait(ctxT(t), h)
	require.NoError(t, err, "Wait")
	assert.Equal(t, want, e.Exit, "Notify, against Wait")
}

// eventsRefusingProxy serves the engine's API on a unix socket of its own, as a socket proxy
// that forbids the event stream does (docker-socket-proxy with EVENTS=0, an authorization
// plugin): GET /events is answered 403, every other request goes to the engine.
func eventsRefusingProxy(t *testing.T) string {
	t.Helper()
	return socketProxy(t, func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"message":"authorization denied by the proxy: events"}`))
	})
}

// TestNotifyEventsRefused: behind a proxy that refuses the event stream but allows the
// container calls, no environment is reported ended for the refusal: each registration, and
// each made after it, is waited on as Wait does, and its end is reported as Wait reports it.
func TestNotifyEventsRefused(t *testing.T) {
	image := testImage(t)
	sock := eventsRefusingProxy(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), func(c *docker.Config) { c.Socket = sock })
	h := startT(t, b, fakeSpec(70, "forever"))
	ch := podworkertest.Notified(t, ctxT(t), b, h)
	require.Eventually(t, func() bool { return docker.EventSubscriptions(b) >= 1 && !docker.EventsRunning(b) },
		testTimeout, 10*time.Millisecond, "the refused event stream is still followed")
	podworkertest.RequireNoEnd(t, ch, h.ID)
	later := startT(t, b, fakeSpec(71, "forever"))
	chLater := podworkertest.Notified(t, ctxT(t), b, later)

	stopContainer(t, h.Data["container_id"])
	e := podworkertest.Receive(t, testTimeout, ch, "stopped behind a proxy that refuses events")
	require.NoError(t, e.Err, "stopped")
	want, err := b.Wait(ctxT(t), h)
	require.NoError(t, err, "Wait")
	assert.Equal(t, want, e.Exit, "Notify, against Wait")
	podworkertest.RequireNoEnd(t, chLater, later.ID)
	require.NoError(t, b.Destroy(ctxT(t), later))
	e = podworkertest.Receive(t, testTimeout, chLater, "destroyed behind a proxy that refuses events")
	if e.Err != nil {
		assert.ErrorIs(t, e.Err, podworker.ErrNotFound, "destroyed: want an exit or not found, as Wait")
	}
	assert.EqualValues(t, 1, docker.EventSubscriptions(b), "subscriptions after the engine refused the stream")
}

// TestNotifyClosed: Close reports no registration ended, neither one served by the event stream
// nor one waited on because the engine refused it, nor one made after Close; each still ends
// with its stop, with the stop's cause.
func TestNotifyClosed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		task    assignment.TaskID
		refused bool
	}{
		{name: "event stream", task: 73},
		{name: "events refused", task: 74, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			image := testImage(t)
			var edit func(*docker.Config)
			if tc.refused {
				sock := eventsRefusingProxy(t)
				edit = func(c *docker.Config) { c.Socket = sock }
			}
			b := newBackend(t, image, t.TempDir(), testScope(t), edit)
			h := startT(t, b, fakeSpec(tc.task, "forever"))
			var stop func(error)
			ch := podworkertest.Ends(t, h, func(ended func(podworker.Exit, error)) { stop = b.Notify(h, ended) })
			if tc.refused {
				require.Eventually(t, func() bool { return docker.EventSubscriptions(b) >= 1 && !docker.EventsRunning(b) },
					testTimeout, 10*time.Millisecond, "the refused event stream is still followed")
			} else {
				require.Eventually(t, func() bool { return docker.Inspections(b) >= 1 && !docker.Inspecting(b) },
					testTimeout, 10*time.Millisecond, "no inspection after subscribing")
			}
			require.NoError(t, b.Close())
			var stopLater func(error)
			later := podworkertest.Ends(t, h, func(ended func(podworker.Exit, error)) { stopLater = b.Notify(h, ended) })
			assert.Never(t, func() bool { return len(ch) > 0 || len(later) > 0 }, 500*time.Millisecond, 10*time.Millisecond,
				"an end reported for Close")
			assert.Zero(t, streamGoroutines(), "goroutines following the event stream after Close")

			stop(errStopped)
			e := podworkertest.Receive(t, testTimeout, ch, "stopped after Close")
			assert.ErrorIs(t, e.Err, errStopped, "stopped after Close = %+v", e.Exit)
			stopLater(errStopped)
			e = podworkertest.Receive(t, testTimeout, later, "made after Close, stopped")
			assert.ErrorIs(t, e.Err, errStopped, "made after Close, stopped = %+v", e.Exit)
		})
	}
}
