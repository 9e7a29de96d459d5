package docker

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/podworker"
)

var _ podworker.Notifier = (*Backend)(nil)

// Notify calls ended once, on a goroutine of its own, with what Wait would return: the
// container's Exit once it stopped, or an error wrapping podworker.ErrNotFound once it is
// gone; or with cause, as it is, once stop(cause) was called before either (a nil cause is
// reported as context.Canceled, as podworker.Await reports it). stop may be called from any
// goroutine, any number of times; once the end was reported it does nothing. While the event
// stream serves it, a registration holds no context and no goroutine of its own (when the
// engine refuses the stream, each is waited on as Wait does). Every registration is served by
// one subscription to the engine's event stream (die, oom and destroy events of the
// backend's scope), opened on the first Notify and closed once no registration is left; the
// container is inspected once after subscribing, so one that ended before Notify is reported
// at once. While the engine cannot be reached the stream reconnects (pausing up to 5 s, as
// Wait retries) and then inspects every registered container once: an environment is never
// reported lost because the engine restarted.
func (b *Backend) Notify(h podworker.Handle, ended func(podworker.Exit, error)) (stop func(cause error)) {
	ref, err := b.checkHandle(h)
	if err != nil {
		go ended(podworker.Exit{}, err)
		return func(error) {}
	}
	return b.notes.add(h, ref, ended)
}

// defaultReplay is how far back each subscription asks the engine to replay events from.
// The engine answers an events request before it subscribes, so an event in between would
// be lost; a replayed event only costs an inspection.
const defaultReplay = time.Second

// recheckEvery is how often the containers of every registration are inspected again while
// the event stream is followed.
const recheckEvery = 2 * time.Minute

// notifier serves every Notify registration of a Backend from one event stream.
type notifier struct {
	b *Backend
	// replay is defaultReplay, and recheck recheckEvery, or what a test sets.
	replay, recheck time.Duration
	// subscriptions counts the event streams opened; beforeSubscribe, when set (tests), is
	// called before each.
	subscriptions   atomic.Int64
	beforeSubscribe func()
	// inspections counts the inspections of registered containers; beforeInspect, when set
	// (tests), is called before each with its number.
	inspections   atomic.Int64
	beforeInspect func(int64)
	// ctx ends the inspections and the Waits of the fallback; close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts the stream's goroutine, the inspections under way and the Waits of the
	// fallback.
	wg sync.WaitGroup

	mu sync.Mutex
	// regs are the registrations not yet reported, by the reference they were made with
	// (a container id, or a name).
	regs   map[string]map[*registration]struct{}
	count  int     // registrations in regs
	cur    *stream // the event stream, nil when none runs
	closed bool
	// refused is the engine's refusal of the event stream, once it refused it for good:
	// every registration is then served by Wait.
	refused error
}

// stream is one run of the event stream, from the first registration to the last.
type stream struct {
	stop context.CancelFunc
	// connected is set (under notifier.mu) while a subscription is open; hangUp ends it.
	connected bool
	hangUp    context.CancelFunc
}

// registration is one Notify call. It holds no context: the inspections run under the
// notifier's, and stop ends it through finish.
type registration struct {
	h   podworker.Handle
	ref string
	// since is when Notify was called, in Unix nanoseconds: events from before it only
	// trigger an inspection.
	since int64
	ended func(podworker.Exit, error)

	// Under notifier.mu.
	done     bool
	checking bool // an inspection is under way
	recheck  bool // an event came during it: inspect again
	died     bool // a die event came, with exitCode
	exitCode int
	oom      bool
	// stopWait, once the engine refused the event stream, ends the Wait that serves r.
	stopWait context.CancelFunc
}

func newNotifier(b *Backend) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	return &notifier{
		b: b, replay: defaultReplay, recheck: recheckEvery,
		ctx: ctx, cancel: cancel,
		regs: make(map[string]map[*registration]struct{}),
	}
}

// add registers a Notify call and returns its stop.
func (n *notifier) add(h podworker.Handle, ref string, ended func(podworker.Exit, error)) (stop func(cause error)) {
	r := &registration{h: h, ref: ref, since: time.Now().UnixNano(), ended: ended}
	n.mu.Lock()
	defer n.mu.Unlock()
	set := n.regs[ref]
	if set == nil {
		set = make(map[*registration]struct{})
		n.regs[ref] = set
	}
	set[r] = struct{}{}
	n.count++
	switch {
	case n.closed:
		// Closed: only stop ends the registration.
	case n.refused != nil:
		n.waitLocked(r)
	case n.cur == nil:
		n.startLocked() // it inspects every registration once subscribed
	case n.cur.connected:
		n.checkLocked(r)
	}
	return func(cause error) {
		if cause == nil {
			cause = context.Canceled
		}
		n.finish(r, podworker.Exit{}, cause)
	}
}

// finish reports r's end, unless it was reported already, and stops the event stream when
// no registration is left.
func (n *notifier) finish(r *registration, exit podworker.Exit, err error) {
	n.mu.Lock()
	if r.done {
		n.mu.Unlock()
		return
	}
	r.done = true
	if r.stopWait != nil {
		r.stopWait()
	}
	set := n.regs[r.ref]
	delete(set, r)
	if len(set) == 0 {
		delete(n.regs, r.ref)
	}
	n.count--
	if n.count == 0 && n.cur != nil {
		n.cur.stop()
		n.cur = nil
	}
	n.mu.Unlock()
	go r.ended(exit, err)
}

// startLocked starts the event stream.
func (n *notifier) startLocked() {
	ctx, stop := context.WithCancel(context.Background())
	s := &stream{stop: stop}
	n.cur = s
	n.wg.Go(func() { n.run(ctx, s) })
}

// run follows the engine's event stream until ctx ends, reconnecting with a growing pause
// whenever it breaks.
func (n *notifier) run(ctx context.Context, s *stream) {
	pause := 100 * time.Millisecond
	for {
		subscribed, err := n.follow(ctx, s)
		n.mu.Lock()
		s.connected = false
		n.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if !transient(err) {
			n.fallBack(s, err)
			return
		}
		if subscribed {
			pause = 100 * time.Millisecond
		}
		n.b.log.Warn().Err(err).Dur("retry_in", pause).Msg("event stream of the engine broke; reconnecting")
		if clock.Sleep(ctx, pause) != nil {
			return
		}
		pause = min(2*pause, maxWaitRetry)
	}
}

// follow subscribes to the engine's events and handles them until the subscription breaks
// or ctx ends. Once subscribed it inspects every registered container, so an end the stream
// missed while it was not subscribed is reported.
func (n *notifier) follow(ctx context.Context, s *stream) (subscribed bool, err error) {
	if n.beforeSubscribe != nil {
		n.beforeSubscribe()
	}
	api, err := n.b.eng.api(ctx)
	if err != nil {
		return false, err
	}
	// Cancelled on return, so the client's reader of the stream ends with follow.
	sctx, hangUp := context.WithCancel(ctx)
	defer hangUp()
	n.subscriptions.Add(1)
	evs := api.Events(sctx, client.EventsListOptions{
		Since: time.Now().Add(-n.replay).UTC().Format(time.RFC3339Nano),
		Filters: make(client.Filters).
			Add("type", string(events.ContainerEventType)).
			Add("label", LabelManaged+"=true", LabelScope+"="+n.b.scope).
			Add("event", string(events.ActionDie), string(events.ActionOOM), string(events.ActionDestroy)),
	})
	n.mu.Lock()
	if n.cur != s {
		n.mu.Unlock()
		return false, ctx.Err()
	}
	s.connected, s.hangUp = true, hangUp
	for _, set := range n.regs {
		for r := range set {
			n.checkLocked(r)
		}
	}
	n.mu.Unlock()
	// The engine drops events a slow subscriber did not take in time: every recheckEvery each
	// registered container is inspected again, so a lost die event delays an end, never
	// hides it.
	recheck := time.NewTicker(n.recheck)
	defer recheck.Stop()
	for {
		select {
		case <-recheck.C:
			n.mu.Lock()
			for _, set := range n.regs {
				for r := range set {
					n.checkLocked(r)
				}
			}
			n.mu.Unlock()
		case m := <-evs.Messages:
			n.event(m)
		case err := <-evs.Err:
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return true, err
		}
	}
}

// fallBack serves every registration by Wait from now on: the engine refused the event
// stream for good (an authorization plugin or a socket proxy that forbids /events, while it
// allows the container calls). A refusal of the stream says nothing of the environments, so
// none is reported ended for it; each is waited on as Wait does, one request to the engine
// and one goroutine each.
func (n *notifier) fallBack(s *stream, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cur == s {
		n.cur = nil
	}
	s.stop()
	if n.closed {
		return
	}
	n.refused = err
	n.b.log.Error().Err(err).Msg("the engine refused its event stream; waiting on each container instead, one request each")
	for _, set := range n.regs {
		for r := range set {
			n.waitLocked(r)
		}
	}
}

// waitLocked reports r's end as Wait finds it, on a goroutine of its own. The Wait's
// context, made now, ends with r (finish cancels it) or with close.
func (n *notifier) waitLocked(r *registration) {
	if r.done {
		return
	}
	ctx, cancel := context.WithCancel(n.ctx)
	r.stopWait = cancel
	n.wg.Go(func() {
		defer cancel()
		exit, err := n.b.Wait(ctx, r.h)
		if ctx.Err() != nil {
			return // reported already, or closed: only stop reports it now
		}
		n.finish(r, exit, err)
	})
}

// event notes what m says of the registered containers and inspects them.
func (n *notifier) event(m events.Message) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ref := range []string{m.Actor.ID, m.Actor.Attributes["name"]} {
		for r := range n.regs[ref] {
			if m.TimeNano < r.since {
				// Replayed from before Notify: what the container's inspection says counts,
				// as for Wait (a container removed before Notify is not found).
				n.checkLocked(r)
				continue
			}
			switch m.Action {
			case events.ActionDie:
				if code, err := strconv.Atoi(m.Actor.Attributes["exitCode"]); err == nil {
					r.died, r.exitCode = true, code
				}
			case events.ActionOOM:
				r.oom = true
			}
			n.checkLocked(r)
		}
	}
}

// checkLocked inspects r's container on a goroutine of its own, or once more when an
// inspection is under way.
func (n *notifier) checkLocked(r *registration) {
	if r.done {
		return
	}
	if r.checking {
		r.recheck = true
		return
	}
	r.checking = true
	n.wg.Go(func() { n.check(r) })
}

// check inspects r's container and reports its end, if it ended. It retries while the
// engine cannot be reached, until r is reported or the notifier closed.
func (n *notifier) check(r *registration) {
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, maxWaitRetry) {
		if i := n.inspections.Add(1); n.beforeInspect != nil {
			n.beforeInspect(i)
		}
		c, err := n.b.inspect(n.ctx, r.ref)
		n.mu.Lock()
		if n.abandonLocked(r) {
			n.mu.Unlock()
			return
		}
		again := r.recheck // an event came during the inspection
		r.recheck = false
		exit, eerr, ended := r.settle(c, err)
		if ended {
			n.mu.Unlock()
			n.finish(r, exit, eerr)
			return
		}
		if err == nil { // it runs
			if !again {
				r.checking = false
				n.mu.Unlock()
				return
			}
			n.mu.Unlock()
			continue
		}
		n.mu.Unlock()
		n.b.envLog(r.h).Warn().Err(err).Dur("retry_in", pause).Msg("inspect on the engine failed; retrying")
		_ = clock.Sleep(n.ctx, pause) // a close ends it early, and abandonLocked sees it
		n.mu.Lock()
		abandon := n.abandonLocked(r)
		n.mu.Unlock()
		if abandon {
			return
		}
	}
}

// abandonLocked reports whether r's inspection is to be given up, marking it ended: r was
// reported already (stopped, or ended) or the notifier closed. The caller holds notifier.mu.
func (n *notifier) abandonLocked(r *registration) bool {
	if r.done || n.ctx.Err() != nil {
		r.checking = false
		return true
	}
	return false
}

// settle is how r ended by the inspection of its container (c, or err), as Wait reports it;
// ended is false while the container runs or the engine cannot be reached. The caller
// holds notifier.mu.
func (r *registration) settle(c container.InspectResponse, err error) (exit podworker.Exit, _ error, ended bool) {
	switch {
	case cerrdefs.IsNotFound(err) && r.died:
		// Removed right after it stopped.
		reason := "exited"
		if r.oom {
			reason = podworker.ExitOOM
		}
		return podworker.Exit{Code: r.exitCode, Reason: reason}, nil, true
	case cerrdefs.IsNotFound(err):
		return podworker.Exit{}, fmt.Errorf("docker: wait %s: %w", r.h.ID, podworker.ErrNotFound), true
	case transient(err):
		return podworker.Exit{}, nil, false
	case err != nil:
		return podworker.Exit{}, fmt.Errorf("docker: wait %s: %w", r.h.ID, err), true
	}
	exit, ended = exitOf(c)
	return exit, nil, ended
}

// exitOf is how container c ended; ended is false while it runs.
func exitOf(c container.InspectResponse) (exit podworker.Exit, ended bool) {
	switch {
	case c.State.Running:
		return podworker.Exit{}, false
	case c.State.Status == container.StateCreated:
		return podworker.Exit{Code: -1, Reason: "never started"}, true
	case c.State.OOMKilled:
		return podworker.Exit{Code: c.State.ExitCode, Reason: podworker.ExitOOM}, true
	}
	return podworker.Exit{Code: c.State.ExitCode, Reason: "exited"}, true
}

// close stops the event stream, the inspections and the Waits of the fallback, and waits for
// their goroutines. Registrations still pending end only with their stop (the worker stops
// them); none is reported ended for the close. It is idempotent.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	if n.cur != nil {
		n.cur.stop()
		n.cur = nil
	}
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
}
