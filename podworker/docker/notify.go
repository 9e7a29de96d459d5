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

// Notify calls ended once, on a goroutine of its own, with what Wait(ctx, h) would return:
// the container's Exit once it stopped, an error wrapping podworker.ErrNotFound once it is
// gone, or an error wrapping ctx's error once ctx is done. Every registration is served by
// one subscription to the engine's event stream (die, oom and destroy events of the
// backend's scope), opened on the first Notify and closed once no registration is left; the
// container is inspected once after subscribing, so one that ended before Notify is reported
// at once. While the engine cannot be reached the stream reconnects (pausing up to 5 s, as
// Wait retries) and then inspects every registered container once: an environment is never
// reported lost because the engine restarted.
func (b *Backend) Notify(ctx context.Context, h podworker.Handle, ended func(podworker.Exit, error)) {
	ref, err := b.checkHandle(h)
	if err != nil {
		go ended(podworker.Exit{}, err)
		return
	}
	b.notes.add(ctx, h, ref, ended)
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
	// wg counts the stream's goroutine and the inspections under way.
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

// registration is one Notify call.
type registration struct {
	h   podworker.Handle
	ref string
	// since is when Notify was called, in Unix nanoseconds: events from before it only
	// trigger an inspection.
	since int64
	// ctx is the caller's context, cancelled once the registration is reported.
	ctx    context.Context
	cancel context.CancelFunc
	ended  func(podworker.Exit, error)

	// Under notifier.mu.
	stopAfter func() bool // stops the AfterFunc of the caller's context
	done      bool
	checking  bool // an inspection is under way
	recheck   bool // an event came during it: inspect again
	died      bool // a die event came, with exitCode
	exitCode  int
	oom       bool
}

func newNotifier(b *Backend) *notifier {
	return &notifier{b: b, replay: defaultReplay, recheck: recheckEvery, regs: make(map[string]map[*registration]struct{})}
}

// add registers a Notify call.
func (n *notifier) add(ctx context.Context, h podworker.Handle, ref string, ended func(podworker.Exit, error)) {
	rctx, cancel := context.WithCancel(ctx)
	r := &registration{h: h, ref: ref, since: time.Now().UnixNano(), ctx: rctx, cancel: cancel, ended: ended}
	n.mu.Lock()
	defer n.mu.Unlock()
	set := n.regs[ref]
	if set == nil {
		set = make(map[*registration]struct{})
		n.regs[ref] = set
	}
	set[r] = struct{}{}
	n.count++
	// AfterFunc runs its function on a goroutine of its own, and only when ctx ends.
	r.stopAfter = context.AfterFunc(ctx, func() {
		n.finish(r, podworker.Exit{}, fmt.Errorf("docker: wait %s: %w", h.ID, ctx.Err()))
	})
	switch {
	case n.closed:
		// Closed: only ctx ends the registration.
	case n.refused != nil:
		n.waitLocked(r)
	case n.cur == nil:
		n.startLocked() // it inspects every registration once subscribed
	case n.cur.connected:
		n.checkLocked(r)
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
	r.stopAfter()
	r.cancel()
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

// waitLocked reports r's end as Wait finds it, on a goroutine of its own.
func (n *notifier) waitLocked(r *registration) {
	if r.done {
		return
	}
	n.wg.Go(func() {
		exit, err := n.b.Wait(r.ctx, r.h)
		if r.ctx.Err() != nil {
			return // reported already, or ctx ended and its AfterFunc reports
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
// engine cannot be reached, until r ends.
func (n *notifier) check(r *registration) {
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, maxWaitRetry) {
		if i := n.inspections.Add(1); n.beforeInspect != nil {
			n.beforeInspect(i)
		}
		c, err := n.b.inspect(r.ctx, r.ref)
		if r.ctx.Err() != nil {
			return // reported already, or ctx ended and its AfterFunc reports
		}
		n.mu.Lock()
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
		if clock.Sleep(r.ctx, pause) != nil {
			return
		}
	}
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

// close stops the event stream and waits for its goroutines. Registrations still pending
// end only with their contexts.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	if n.cur != nil {
		n.cur.stop()
		n.cur = nil
	}
	for _, set := range n.regs {
		for r := range set {
			r.cancel() // their inspections end; AfterFunc still reports ctx's end
		}
	}
	n.mu.Unlock()
	n.wg.Wait()
}
