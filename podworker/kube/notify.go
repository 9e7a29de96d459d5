package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/dynrunner/dynrunner/podworker"
)

var _ podworker.Notifier = (*Backend)(nil)

// lookUpTimeout bounds the GET of a Pod the informer has not seen, which the informer's one
// goroutine waits for; a GET that times out is retried.
const lookUpTimeout = 30 * time.Second

// Notify calls ended once, on a goroutine of its own, with what Wait would return: the Pod's
// Exit once it ended, or an error wrapping podworker.ErrNotFound (with Exit reason "deleted")
// once it is gone or replaced by a newer Pod of the same name; or with cause, as it is, once
// stop(cause) was called before either (context.Canceled for a nil cause). stop may be called
// any number of times, from any goroutine; once ended was called it does nothing. Every
// registration is served by one informer: a single list and watch of the backend's Pods
// (Selector) in the namespace, started by the first Notify and stopped when no registration
// is left; a registration keeps no context or goroutine of its own. A Pod that ended or is
// gone before Notify is reported at once. While the apiserver cannot be reached the informer
// retries and nothing is reported; when it relists, Pods deleted meanwhile are reported gone.
// A Pod whose labels are removed leaves the informer's view and is reported gone, unlike
// Wait, which watches it by name. Phase changes go to Config.OnPhase as Wait reports them, in
// order for each Pod, before ended is called, with the informer's ctx: it is done only once
// the informer stopped, which it does after the OnPhase calls of its last registration.
func (b *Backend) Notify(h podworker.Handle, ended func(podworker.Exit, error)) (stop func(cause error)) {
	uid, err := checkHandle(h)
	if err != nil {
		go ended(podworker.Exit{}, err)
		return func(error) {}
	}
	r := &registration{h: h, uid: uid, ended: ended}
	r.ph = &phases{h: h, uid: uid}
	w := &b.notifier
	if b.onPhase != nil {
		r.ph.fn = func(ctx context.Context, h podworker.Handle, c PhaseChange) {
			w.enqueue(r, func() { b.onPhase(ctx, h, c) })
		}
	}
	w.register(b, r)
	return func(cause error) {
		if cause == nil {
			cause = context.Canceled
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.finish(r, podworker.Exit{}, cause)
	}
}

// registration is one Notify call. It stays in the notifier's registrations, and keeps the
// informer running, until its queue reaches ended.
type registration struct {
	h     podworker.Handle
	uid   string // the handle's Pod UID, "" when it has none
	ended func(podworker.Exit, error)
	// The rest is guarded by notifier.mu.
	ph      *phases
	done    bool     // ended is queued; nothing more is
	queue   []func() // OnPhase calls, then ended: run in order by one goroutine at a time
	running bool     // a goroutine runs queue
	seen    bool     // the informer showed the handle's Pod
}

// notifier serves every Notify of a Backend: its registrations and the informer.
type notifier struct {
	mu   sync.Mutex
	regs map[string]map[*registration]struct{} // by Pod name
	cur  *informer                             // the running informer; nil when none runs
}

// informer is one run of the shared informer, from the first registration to the last.
type informer struct {
	// ctx is done once the informer is stopped (cancel): it bounds the informer's list and
	// watch and its look-ups, and is the ctx of every registration's OnPhase calls. All
	// registrations share it; none has a context of its own.
	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{} // wakes its run loop for pending (buffered, one)
	store  cache.Store
	// pending are registrations whose Pod the store did not show yet, or showed as another
	// Pod of the same name: the run loop looks them up once the store has synced. unseen are
	// those whose Pod the apiserver had and the informer had not seen yet: they are looked
	// up again every unseenRecheck until it has (a watch that broke before the informer saw
	// the Pod, and a deletion before its relist, would otherwise leave them waiting).
	// Guarded by notifier.mu.
	pending, unseen []*registration
}

// unseenRecheck is how often registrations whose Pod the informer has not seen yet are looked
// up again.
const unseenRecheck = 10 * time.Second

// register adds r and starts the informer if none runs.
func (w *notifier) register(b *Backend, r *registration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.regs == nil {
		w.regs = map[string]map[*registration]struct{}{}
	}
	if w.regs[r.h.ID] == nil {
		w.regs[r.h.ID] = map[*registration]struct{}{}
	}
	w.regs[r.h.ID][r] = struct{}{}
	if w.cur == nil {
		w.cur = w.start(b)
	}
	w.cur.pending = append(w.cur.pending, r)
	select {
	case w.cur.kick <- struct{}{}:
	default:
	}
}

// start starts an informer and its run loop; w.mu is held.
func (w *notifier) start(b *Backend) *informer {
	lw := cache.NewFilteredListWatchFromClient(b.client.CoreV1().RESTClient(), "pods", b.ns,
		func(o *metav1.ListOptions) { o.LabelSelector = selector })
	var store cache.Store
	store, ctl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.changed(store, obj) },
			UpdateFunc: func(_, obj any) { w.changed(store, obj) },
			DeleteFunc: func(obj any) { w.deleted(obj) },
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	inf := &informer{ctx: ctx, cancel: cancel, kick: make(chan struct{}, 1), store: store}
	go w.run(b, inf, ctl)
	return inf
}

// run runs the informer until it is stopped and looks up pending registrations whenever
// kicked, once the informer has synced.
func (w *notifier) run(b *Backend, inf *informer, ctl cache.Controller) {
	var wg sync.WaitGroup
	wg.Go(func() { ctl.Run(inf.ctx.Done()) })
	defer wg.Wait()
	if !cache.WaitForCacheSync(inf.ctx.Done(), ctl.HasSynced) {
		return
	}
	pause := 100 * time.Millisecond
	var retry <-chan time.Time
	recheck := time.NewTicker(unseenRecheck)
	defer recheck.Stop()
	for {
		select {
		case <-inf.ctx.Done():
			return
		case <-inf.kick:
		case <-retry:
			retry = nil
		case <-recheck.C:
			w.recheckUnseen(inf)
		}
		if w.lookUp(b, inf) {
			pause = 100 * time.Millisecond
			continue
		}
		b.log.Debug().Dur("retry_in", pause).Msg("get pod failed; retrying")
		retry = time.After(pause)
		pause = min(2*pause, maxWaitRetry)
	}
}

// lookUp checks every pending registration against the synced store and, for a Pod the store
// lacks, GETs it once to tell "gone" from "not yet seen". It reports false when a GET failed
// transiently; those registrations stay pending.
func (w *notifier) lookUp(b *Backend, inf *informer) bool {
	store := inf.store
	w.mu.Lock()
	todo := inf.pending
	inf.pending = nil
	w.mu.Unlock()
	ok := true
	for _, r := range todo {
		w.mu.Lock()
		if r.done {
			w.mu.Unlock()
			continue
		}
		if pod, ok := storedPod(store, b.ns, r); ok {
			w.observe(r, pod, false)
			w.mu.Unlock()
			continue
		}
		w.mu.Unlock()
		gctx, cancel := context.WithTimeout(inf.ctx, lookUpTimeout)
		pod, err := b.client.CoreV1().Pods(b.ns).Get(gctx, r.h.ID, metav1.GetOptions{})
		cancel()
		w.mu.Lock()
		switch {
		case r.done:
			// Ended or stopped meanwhile (the informer stops only once every registration
			// is done).
		case err != nil && !apierrors.IsNotFound(err) && transient(err):
			b.envLog(r.h).Warn().Err(err).Msg("get pod failed; retrying")
			inf.pending = append(inf.pending, r)
			ok = false
		case err != nil && !apierrors.IsNotFound(err):
			w.finish(r, podworker.Exit{}, fmt.Errorf("kube: wait %s: %w", r.h.ID, err))
		default:
			if stored, ok := storedPod(store, b.ns, r); ok {
				// The informer saw it during the GET.
				w.observe(r, stored, false)
				break
			}
			if err != nil {
				r.ph.gone(inf.ctx, "")
				w.finishGone(r, nil)
				break
			}
			if r.uid != "" && string(pod.UID) != r.uid {
				// The apiserver's Pod of that name is another one: names are unique, so the
				// handle's is gone.
				r.ph.gone(inf.ctx, reasonReplaced)
				w.finishGone(r, nil)
				break
			}
			// Not yet seen by the informer (just created): it reports the Pod once it does,
			// unless it ended already or is not the handle's; until then it is looked up
			// again every unseenRecheck.
			if _, done := exitOf(pod); done || !managed(pod) {
				w.observe(r, pod, !managed(pod))
				break
			}
			inf.unseen = append(inf.unseen, r)
		}
		w.mu.Unlock()
	}
	return ok
}

// changed handles an added or updated Pod: the registrations of its name look at the store's
// current state of it, so that they never see an older state after a newer one.
func (w *notifier) changed(store cache.Store, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	regs := w.regs[pod.Name]
	if len(regs) == 0 {
		return
	}
	if cur, exists, _ := store.Get(pod); exists {
		pod = cur.(*corev1.Pod)
	}
	for r := range regs {
		w.observe(r, pod, false)
	}
}

// deleted handles a Pod that was deleted (or that a relist no longer found).
func (w *notifier) deleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for r := range w.regs[pod.Name] {
		w.observe(r, pod, true)
	}
}

// observe applies one state of r's Pod name, as Wait's watch does; w.mu is held.
func (w *notifier) observe(r *registration, pod *corev1.Pod, gone bool) {
	if r.done {
		return
	}
	// r is registered, so the informer runs: the current one, as it stops only once no
	// registration is left (a stopped one may still deliver an event it had queued).
	ctx := w.cur.ctx
	switch {
	case r.uid != "" && string(pod.UID) != r.uid:
		// Another Pod of the same name: a newer one that replaced the handle's, or an older
		// one whose events the informer still delivers (a Pod deleted and created again by
		// Start). Only the apiserver's current Pod of the name tells which: look it up.
		w.verifyLocked(r)
		return
	case gone:
		r.ph.saw(ctx, pod)
		r.ph.gone(ctx, "")
		w.finishGone(r, pod)
		return
	}
	r.seen = true
	r.ph.saw(ctx, pod)
	if exit, done := exitOf(pod); done {
		r.ph.ended(ctx, pod)
		w.finish(r, exit, nil)
	}
}

// verifyLocked has the run loop look r up; w.mu is held.
func (w *notifier) verifyLocked(r *registration) {
	if w.cur == nil {
		return
	}
	w.cur.pending = append(w.cur.pending, r)
	select {
	case w.cur.kick <- struct{}{}:
	default:
	}
}

// recheckUnseen looks up again the registrations whose Pod the informer has not shown yet.
func (w *notifier) recheckUnseen(inf *informer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	unseen := inf.unseen
	inf.unseen = nil
	for _, r := range unseen {
		if !r.done && !r.seen {
			inf.pending = append(inf.pending, r)
		}
	}
	if len(inf.pending) > 0 {
		select {
		case inf.kick <- struct{}{}:
		default:
		}
	}
}

// storedPod returns r's Pod from the informer's store, when the store holds the handle's Pod
// (another Pod of the name is not r's).
func storedPod(store cache.Store, ns string, r *registration) (*corev1.Pod, bool) {
	obj, exists, _ := store.GetByKey(ns + "/" + r.h.ID)
	if !exists {
		return nil, false
	}
	pod := obj.(*corev1.Pod)
	if r.uid != "" && string(pod.UID) != r.uid {
		return nil, false
	}
	return pod, true
}

// finish queues r's ended call after its OnPhase calls; w.mu is held. The queue's goroutine
// removes r before it calls ended.
func (w *notifier) finish(r *registration, exit podworker.Exit, err error) {
	if r.done {
		return
	}
	r.done = true
	w.enqueue(r, func() { r.ended(exit, err) })
}

// remove removes r, whose OnPhase calls have run, and stops the informer when no registration
// is left; w.mu is held.
func (w *notifier) remove(r *registration) {
	regs := w.regs[r.h.ID]
	delete(regs, r)
	if len(regs) == 0 {
		delete(w.regs, r.h.ID)
	}
	if len(w.regs) == 0 && w.cur != nil {
		w.cur.cancel()
		w.cur = nil
	}
}

// finishGone finishes r with Wait's answer for a Pod that is gone; last is its final state, if
// known. w.mu is held.
func (w *notifier) finishGone(r *registration, last *corev1.Pod) {
	exit, err := deleted(r.h, last)
	w.finish(r, exit, err)
}

// enqueue adds f to r's queue and starts a goroutine to run it unless one runs; w.mu is held.
// OnPhase and ended thus run in order for each Pod, never on the informer's goroutine.
func (w *notifier) enqueue(r *registration, f func()) {
	r.queue = append(r.queue, f)
	if r.running {
		return
	}
	r.running = true
	go w.drain(r)
}

// drain runs r's queue until it is empty.
func (w *notifier) drain(r *registration) {
	for {
		w.mu.Lock()
		if len(r.queue) == 0 {
			r.running = false
			w.mu.Unlock()
			return
		}
		f := r.queue[0]
		r.queue[0] = nil
		r.queue = r.queue[1:]
		if r.done && len(r.queue) == 0 {
			// f is ended, queued last: r needs the informer no more.
			w.remove(r)
		}
		w.mu.Unlock()
		f()
	}
}
