package podworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/grants"
	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
)

// Identity gives an environment its identity material: the files (SVID, bundle) it needs to
// prove who it is, valid until notAfter (the end of the assignment's lease) and no longer.
// Backends whose environments get SVIDs elsewhere (SPIRE) return none.
type Identity interface {
	Files(task assignment.TaskID, epoch assignment.Epoch, notAfter time.Time) (map[string][]byte, error)
}

// TokenFile is the name of the capability token file in an environment's secrets directory.
const TokenFile = "capability-token"

// Config configures a Worker.
type Config struct {
	// Actor names the worker in the records it appends ("pod-worker@host/pid/instance"). It must
	// be unique among the running workers: it is the value of the keys in eventlog.BucketWorkers that
	// name the environments it watches, which other workers adopt only once the key is gone.
	Actor string
	// Backend is the isolation tier this worker consumes: pod (or vm, for the vm worker's reuse).
	Tier assignment.Backend
	// Concurrency is how many environments run at once.
	Concurrency int
	Issuer      *captoken.Issuer
	Identity    Identity
	// ExecutorEnv is the environments' non-secret configuration (facade URL, runner binary),
	// executor.Config.Environ; the worker adds the assignment's task, epoch and forge URL
	// (executor.Config.AssignmentEnv), the backend its own (executor.Config.BackendEnv).
	ExecutorEnv map[string]string
	// Reap is how often environments no live assignment owns are looked for.
	Reap time.Duration
	// Heartbeat is how often the worker renews its keys in eventlog.BucketWorkers; they expire
	// after the bucket's TTL (eventlog.Config.WorkersTTL), by default three heartbeats.
	Heartbeat time.Duration
	// RetryDelay is the redelivery delay after a failed start, times the delivery count.
	RetryDelay time.Duration
	// Grants is GRANTS_FILE's policy, checked again before an environment starts (the
	// scheduler checked it before claiming): an assignment whose grant does not cover its
	// tier fails instead. Nil grants every tier.
	Grants *grants.Policy
	// GitHub configures the environments of GitHub slots; nil: this worker refuses them.
	GitHub *GitHub
	// Metrics records environment start times and job durations (nil: none).
	Metrics *Metrics
	Log     zerolog.Logger
	Now     func() time.Time
}

// GitHub configures a worker for GitHub slots: their environments run the pinned GitHub
// Actions runner (Env: its pin and log format; the worker adds the slot, the backend its
// directories) with the slot's JIT configuration, which Box (TASK_KEY's) opens.
type GitHub struct {
	Env executor.GitHubConfig
	Box *sealbox.Box
}

// Worker consumes dispatches of one tier and runs their environments on a Backend.
type Worker struct {
	cfg     Config
	backend Backend
	log     EventLog
	view    View
	workers jetstream.KeyValue

	slots chan struct{}
	// draining: cordoned; the worker takes no new dispatch and finishes what it has.
	draining atomic.Bool
	// handling counts dispatches fetched and not yet handled: from the moment one is taken
	// off the consumer (before the drain check) until handle returns, by when an environment
	// it starts is in envs. InFlight counts them, so a drained worker never reports itself
	// safe to remove while a dispatch it took is still becoming an environment.
	handling atomic.Int64
	mu       sync.Mutex
	envs     map[assignment.TaskID]*env
	// stopped: Run is returning; environments are no longer watched (stopWatches).
	stopped bool
	wg      sync.WaitGroup
	ready   chan struct{}
}

// env is an environment the worker watches, or a reservation (zero h and key) while one starts
// or is being adopted.
type env struct {
	h Handle
	// stop ends the watch (Await), nil until it began; released is set when another worker
	// took the key before then. Both guarded by Worker.mu.
	stop     func(cause error)
	released bool
	// key is the environment's key in eventlog.BucketWorkers; rev the revision this worker last wrote
	// there, 0 while it holds none (the claim failed; the next heartbeat claims it). rev is
	// guarded by Worker.mu.
	key string
	rev uint64
	// until is the end of the lease the environment's identity files were last issued for,
	// guarded by Worker.mu.
	until time.Time
}

// New returns a Worker, subscribed to view: call it before view is fed (eventlog.View).
func New(cfg Config, backend Backend, log EventLog, view View) *Worker {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Reap <= 0 {
		cfg.Reap = 30 * time.Second
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = 2 * time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = log.Config().WorkersTTL / heartbeatsPerTTL
	}
	w := &Worker{cfg: cfg, backend: backend, log: log, view: view,
		slots: make(chan struct{}, cfg.Concurrency), envs: make(map[assignment.TaskID]*env), ready: make(chan struct{})}
	view.OnChange(w.onChange)
	return w
}

// InFlight counts the environments the worker watches or is starting now: what its heartbeat
// reports beside its Concurrency.
// A dispatch being handled counts too (at most once more than it should, while its
// environment is already in envs): read after Draining, an InFlight of zero means nothing can
// still start.
func (w *Worker) InFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.envs) + int(w.handling.Load())
}

// SetDraining cordons the worker (true) or lifts its cordon: a draining worker fetches no new
// dispatch (one fetched as the cordon came is handed back at once, for another worker) and
// finishes the environments it has. Its environments' adoption on a crash is unchanged.
func (w *Worker) SetDraining(on bool) {
	if w.draining.Swap(on) != on {
		w.cfg.Log.Info().Bool("draining", on).Msg("drain state changed")
	}
}

// Draining reports whether the worker is cordoned.
func (w *Worker) Draining() bool { return w.draining.Load() }

// drainPoll is how often a draining worker looks whether its cordon was lifted.
const drainPoll = 200 * time.Millisecond

// orphanRecheck is how soon a draining worker that left an orphaned environment alone sweeps
// again, to adopt it if its cordon was lifted meanwhile.
const orphanRecheck = 5 * time.Second

// Ready is closed once the worker recovered its environments and consumes dispatches.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Run announces the worker in eventlog.BucketWorkers, recovers environments, then consumes dispatches
// until ctx ends. Environments keep running when it returns; it deletes its keys, and the next
// Run, or another worker, adopts them. It returns nil on cancellation.
func (w *Worker) Run(ctx context.Context) error {
	select {
	case <-w.view.Ready():
	case <-ctx.Done():
		return nil
	}
	if w.cfg.Heartbeat >= w.ttl() {
		return fmt.Errorf("podworker: heartbeat %s: the keys in %s expire after %s, so it must be shorter", w.cfg.Heartbeat, eventlog.BucketWorkers, w.ttl())
	}
	w.workers = w.log.Workers()
	if err := w.beat(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// The keys go only once every goroutine stopped, on an early error return too: nothing
	// watches the environments then.
	defer w.leave(ctx)
	defer w.wg.Wait()
	defer w.stopWatches()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.wg.Go(func() { w.heartbeatLoop(ctx) })
	recheck, err := w.sweep(ctx)
	if err != nil {
		return fmt.Errorf("podworker: recover environments: %w", err)
	}
	cons, err := w.log.Consumer(ctx, w.cfg.Tier)
	if err != nil {
		return err
	}
	close(w.ready)
	w.wg.Go(func() { w.reapLoop(ctx, recheck) })
	for {
		if w.draining.Load() {
			if clock.Sleep(ctx, drainPoll) != nil {
				return nil
			}
			continue
		}
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		msg, err := cons.Next(jetstream.FetchContext(fctx))
		cancel()
		if err == nil {
			w.handling.Add(1) // before the drain check: see handling
		}
		if err == nil && w.draining.Load() {
			// Cordoned while it waited: hand the dispatch back for another worker.
			_ = msg.Nak()
			w.handling.Add(-1)
			<-w.slots
			continue
		}
		if err != nil {
			<-w.slots
			if ctx.Err() != nil {
				return nil
			}
			if !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
				w.cfg.Log.Warn().Err(err).Msg("fetch dispatch")
				_ = clock.Sleep(ctx, time.Second)
			}
			continue
		}
		// Starting an environment can take seconds (a container, a Pod); dispatches are
		// handled concurrently, as many as there are slots.
		w.wg.Go(func() {
			defer w.handling.Add(-1)
			if !w.handle(ctx, msg) {
				<-w.slots // no environment holds the slot
			}
		})
	}
}

// handle processes one dispatch message and reports whether an environment now holds the slot:
// it reads the message and the assignment, asks planDispatch what to do, and does it.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) bool {
	s := w.readDispatch(ctx, msg)
	a := planDispatch(s)
	if a.kind == dispatchPoison {
		w.cfg.Log.Error().Err(s.parseErr).Msg("poison dispatch message")
		w.deadLetter(ctx, msg, a.reason)
		return false
	}
	d, st := s.d, s.st
	logger := w.cfg.Log.With().Int64(logkey.TaskID, int64(d.Task)).Uint64(logkey.Epoch, uint64(d.Epoch)).Logger()
	switch a.kind {
	case dispatchOrphan:
		logger.Error().Msg("dispatch for a task without an assignment")
		w.deadLetter(ctx, msg, a.reason)
		return false
	case dispatchRetry:
		w.retry(ctx, msg, &st, a.cause)
		return false
	case dispatchDrop:
		logger.Info().Str(logkey.Phase, string(st.Phase)).Msg("dispatch no longer current; dropped")
		_ = msg.Ack()
		return false
	case dispatchRefuse:
		w.refuse(ctx, msg, st, a.reason, logger)
		return false
	}
	// Reserve the task before anything is started or recorded, so neither a redelivery nor the
	// reaper takes the environment this dispatch is starting.
	if !w.reserve(d.Task) {
		_ = msg.Ack() // a redelivery while the environment starts or runs
		return false
	}
	var held bool
	if a.kind == dispatchAdopt {
		held = w.adoptDispatched(ctx, msg, d, st, a.handle, logger)
	} else {
		held = w.startDispatched(ctx, msg, d, st, a.destroyUnrecorded, logger)
	}
	if !held {
		w.forget(d.Task)
	}
	return held
}

// readDispatch parses a dispatch message and reads its assignment: from the view, or from
// JetStream when the view does not know the message's epoch.
func (w *Worker) readDispatch(ctx context.Context, msg jetstream.Msg) dispatchSnapshot {
	var s dispatchSnapshot
	s.delivered, s.deliveredOK = delivery(msg)
	if s.d, s.parseErr = w.log.ParseDispatch(msg); s.parseErr != nil {
		return s
	}
	var ok bool
	if s.st, ok = w.view.Get(s.d.Task); !ok || s.st.Epoch() != s.d.Epoch {
		// The view has not seen the claim yet (or lags): read it from JetStream.
		s.st, s.readErr = w.log.Get(ctx, s.d.Task)
	}
	if s.readErr == nil {
		s.refused = w.cfg.Grants.Check(grants.Subject{Repo: s.st.Repo, Fork: s.st.Fork}, s.st.Backend)
		if s.refused == nil && s.st.Backend != w.cfg.Tier {
			s.refused = fmt.Errorf("the assignment is for the %s tier, and this worker runs %s", s.st.Backend, w.cfg.Tier)
		}
	}
	return s
}

// refuse fails st, whose grant does not cover its tier, instead of starting its environment;
// the scheduler tells the forge why.
func (w *Worker) refuse(ctx context.Context, msg jetstream.Msg, st assignment.State, reason string, logger zerolog.Logger) {
	logger.Warn().Str("reason", reason).Msg("assignment refused; failing it")
	_, err := w.log.Apply(ctx, assignment.Event{Transition: assignment.Failed, Task: st.Task, Epoch: st.Epoch(),
		Actor: w.cfg.Actor, At: w.cfg.Now(), Reason: "the " + string(w.cfg.Tier) + " worker refused it: " + reason}, &st)
	if err != nil && !startRefused(err) {
		w.retry(ctx, msg, &st, err)
		return
	}
	_ = msg.Ack()
}

// delivery returns a message's delivery count; false when its metadata cannot be read.
func delivery(msg jetstream.Msg) (uint64, bool) {
	md, err := msg.Metadata()
	if err != nil {
		return 0, false
	}
	return md.NumDelivered, true
}

// adoptDispatched adopts the environment h, started before a crash, that st (the assignment d
// is for) records, unless another worker watches it (its acknowledgement was lost, or it
// adopted the environment). When that cannot be told, the sweep decides later. It reports
// whether the environment now holds the slot.
func (w *Worker) adoptDispatched(ctx context.Context, msg jetstream.Msg, d eventlog.DispatchMsg, st assignment.State, h Handle, logger zerolog.Logger) bool {
	c, err := w.claim(ctx, envKey(d.Task, d.Epoch))
	if err != nil || c.rev == 0 {
		logger.Debug().Err(err).Str("watcher", c.actor).Msg("redelivered dispatch of an environment another worker watches; left to it")
		_ = msg.Ack()
		return false
	}
	w.watch(ctx, st, h, true, c.rev)
	_ = msg.Ack()
	return true
}

// startDispatched records `dispatched` for st, the assignment d is for, starts its environment
// and records `started`.
// It reports whether the environment now holds the slot.
func (w *Worker) startDispatched(ctx context.Context, msg jetstream.Msg, d eventlog.DispatchMsg, st assignment.State, destroyUnrecorded bool, logger zerolog.Logger) bool {
	next, err := w.log.Apply(ctx, assignment.Event{Transition: assignment.Dispatched, Task: d.Task, Epoch: d.Epoch, Actor: w.cfg.Actor, At: w.cfg.Now()}, &st)
	if err != nil && !errors.Is(err, assignment.ErrNoChange) {
		w.retry(ctx, msg, &st, err)
		return false
	}
	if err == nil {
		w.view.Observe(next)
		st = next
	}
	if destroyUnrecorded {
		w.destroyUnrecorded(ctx, st)
	}
	began := time.Now()
	h, tokenID, err := w.start(ctx, msg, st)
	if errors.Is(err, errNoJIT) {
		w.refuse(ctx, msg, st, err.Error(), logger)
		return false
	}
	if err != nil {
		logger.Warn().Err(err).Msg("start environment")
		w.retry(ctx, msg, &st, err)
		return false
	}
	took := time.Since(began)
	hj, _ := json.Marshal(h)
	rec, err := w.log.Apply(ctx, assignment.Event{Transition: assignment.Started, Task: d.Task, Epoch: d.Epoch,
		Actor: w.cfg.Actor, At: w.cfg.Now(), Handle: hj, TokenID: tokenID}, &st)
	if err != nil {
		// The assignment moved on (failed, or a stale epoch): the environment must not run.
		logger.Warn().Err(err).Msg("record started; destroying the environment")
		_ = w.backend.Destroy(context.WithoutCancel(ctx), h)
		if startRefused(err) {
			_ = msg.Ack()
		} else {
			w.retry(ctx, msg, &st, err)
		}
		return false
	}
	w.view.Observe(rec)
	w.cfg.Metrics.started(rec, w.backend.Name(), took, w.cfg.Now())
	logger = logger.With().Str(logkey.Env, h.ID).Logger()
	logger.Info().Str(logkey.Backend, w.backend.Name()).Msg("environment started")
	// The key is claimed once `started` is recorded, never before: a key exists only for an
	// environment some worker can adopt. Between the two, a crash leaves an environment
	// without a key, which the next sweep of any worker adopts; a sweep that claims it first
	// makes it that worker's.
	c, err := w.claim(ctx, envKey(d.Task, d.Epoch))
	if err == nil && c.rev == 0 {
		logger.Info().Str("watcher", c.actor).Msg("another worker adopted the environment as it was recorded; left to it")
		_ = msg.Ack()
		return false
	}
	if err != nil {
		logger.Warn().Err(err).Msg("watching the environment without its key; the next heartbeat claims it")
	}
	w.watch(ctx, rec, h, true, c.rev)
	_ = msg.Ack()
	return true
}

// start issues the environment's token and identity and starts it, telling JetStream the
// message is in progress while the backend works. The token expires with the assignment's
// pickup deadline: an environment that has not registered by then is failed anyway.
func (w *Worker) start(ctx context.Context, msg jetstream.Msg, st assignment.State) (Handle, string, error) {
	var env map[string]string
	var files map[string][]byte
	var tokenID string
	var err error
	if st.GitHub() {
		env, files, err = w.githubEnvironment(ctx, st)
	} else {
		env, files, tokenID, err = w.giteaEnvironment(st)
	}
	if err != nil {
		return Handle{}, "", err
	}
	progress, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-progress.Done():
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	h, err := w.backend.Start(ctx, Spec{Task: st.Task, Epoch: st.Epoch(), Env: env, Files: files})
	if err != nil {
		return Handle{}, "", err
	}
	return h, tokenID, nil
}

// giteaEnvironment is a Gitea assignment's environment: the executor contract, the capability
// token it registers with and, with a development CA, its SVID.
func (w *Worker) giteaEnvironment(st assignment.State) (map[string]string, map[string][]byte, string, error) {
	tok, err := w.cfg.Issuer.Issue(st.Task, st.Epoch(), captoken.PurposeRegister, st.PickupDeadline)
	if err != nil {
		return nil, nil, "", fmt.Errorf("podworker: capability token: %w", err)
	}
	files := map[string][]byte{TokenFile: []byte(tok.Secret())}
	if w.cfg.Identity != nil {
		idf, err := w.cfg.Identity.Files(st.Task, st.Epoch(), st.LeaseExpires)
		if err != nil {
			return nil, nil, "", fmt.Errorf("podworker: identity: %w", err)
		}
		maps.Copy(files, idf)
	}
	return envOf(w.cfg.ExecutorEnv, st), files, tok.ID(), nil
}

// errNoJIT: a GitHub slot has no JIT configuration of its own, stored and sealed for it, that
// matches the digest `configured` recorded. The slot fails at once: no retry brings one.
var errNoJIT = errors.New("podworker: the slot has no JIT configuration of its own")

// githubEnvironment is a GitHub slot's environment: the pinned GitHub Actions runner and the
// slot's JIT configuration, its only credential (no token, no SVID: it never reaches the
// facade).
func (w *Worker) githubEnvironment(ctx context.Context, st assignment.State) (map[string]string, map[string][]byte, error) {
	gh := w.cfg.GitHub
	if gh == nil || gh.Box == nil {
		return nil, nil, fmt.Errorf("podworker: GitHub slot %d reached a worker not configured for GitHub (GITHUB_RUNNER_BIN, GITHUB_RUNNER_SHA256 and TASK_KEY)", st.Task)
	}
	sealed, err := w.log.GetTask(ctx, st.Task)
	if errors.Is(err, assignment.ErrNotFound) {
		return nil, nil, fmt.Errorf("%w: slot %d has none stored (%w)", errNoJIT, st.Task, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("podworker: the JIT configuration of slot %d: %w", st.Task, err)
	}
	jit, err := sealedtask.OpenJIT(gh.Box, st.Task, sealed, st.TaskDigest)
	if err != nil {
		// Not the one `configured` recorded, or sealed for another slot (or with another
		// TASK_KEY): reading it again changes nothing.
		return nil, nil, fmt.Errorf("%w: %w", errNoJIT, err)
	}
	cfg := gh.Env
	cfg.Task, cfg.Epoch = st.Task, st.Epoch()
	return cfg.Environ(), map[string][]byte{executor.JITConfigFile: []byte(jit)}, nil
}

// envOf is the environment variables of st's environment before its backend adds its own:
// the controller's (ExecutorEnv), then the assignment's (executor.Config.AssignmentEnv).
func envOf(controller map[string]string, st assignment.State) map[string]string {
	env := make(map[string]string, len(controller)+3)
	maps.Copy(env, controller)
	maps.Copy(env, executor.Config{Task: st.Task, Epoch: st.Epoch(), ForgeURL: st.ForgeURL}.AssignmentEnv())
	return env
}

// destroyUnrecorded destroys environments of st's task and epoch that no `started` record
// names.
func (w *Worker) destroyUnrecorded(ctx context.Context, st assignment.State) {
	hs, err := w.backend.List(ctx)
	if err != nil {
		w.cfg.Log.Warn().Err(err).Int64(logkey.TaskID, int64(st.Task)).Msg("list environments before a retried start")
		return
	}
	for _, h := range hs {
		if h.Task == st.Task && h.Epoch == st.Epoch() {
			if err := w.backend.Destroy(ctx, h); err != nil {
				w.cfg.Log.Warn().Err(err).Str(logkey.Env, h.ID).Msg("destroy an unrecorded environment")
			}
		}
	}
}

// retry naks a message for redelivery, or on its last delivery fails the assignment and
// dead-letters the message.
func (w *Worker) retry(ctx context.Context, msg jetstream.Msg, st *assignment.State, cause error) {
	n, ok := delivery(msg)
	if r := planRetry(n, ok, uint64(w.log.Config().DispatchMaxDeliver), w.cfg.RetryDelay); !r.giveUp {
		_ = msg.NakWithDelay(r.delay)
		return
	}
	if st != nil && st.Task > 0 {
		_, _ = w.log.Apply(ctx, assignment.Event{Transition: assignment.Failed, Task: st.Task, Epoch: st.Epoch(),
			Actor: w.cfg.Actor, At: w.cfg.Now(), Reason: "the " + w.backend.Name() + " backend could not start an environment: " + cause.Error()}, st)
	}
	w.deadLetter(ctx, msg, cause.Error())
}

func (w *Worker) deadLetter(ctx context.Context, msg jetstream.Msg, reason string) {
	if err := w.log.DeadLetter(ctx, w.cfg.Tier, msg.Data(), reason); err != nil {
		w.cfg.Log.Error().Err(err).Msg("dead-letter")
		_ = msg.Nak()
		return
	}
	_ = msg.TermWithReason(reason)
}

// reserve marks task as this worker's while its environment starts; false when it already is.
func (w *Worker) reserve(task assignment.TaskID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.envs[task]; ok {
		return false
	}
	w.envs[task] = &env{}
	return true
}

func (w *Worker) owns(task assignment.TaskID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.envs[task]
	return ok
}

// watch waits for an environment to end, fails its assignment if the job had not completed,
// and destroys it. rev is the revision of the environment's key this worker holds (0: none
// yet); the key is deleted once the environment is destroyed. The slot the environment holds
// is released at the end.
func (w *Worker) watch(ctx context.Context, st assignment.State, h Handle, slot bool, rev uint64) {
	e := &env{h: h, key: envKey(st.Task, st.Epoch()), rev: rev, until: st.LeaseExpires}
	w.mu.Lock()
	w.envs[st.Task] = e
	w.mu.Unlock()
	// A renewal recorded while the environment started (between its `started` and now) found
	// no environment to renew the identity of: renew it now.
	if cur, ok := w.view.Get(st.Task); ok && cur.Epoch() == st.Epoch() && cur.Active() {
		w.renewIdentity(e, cur)
	}
	// No goroutine and no context waits while the environment runs when the backend is a
	// Notifier: ended runs once it ended, or once the watch is stopped (stopWatches,
	// errReleased). What waits keeps only what it needs of st.
	a := watched{task: st.Task, epoch: st.Epoch(), seq: st.Seq}
	w.wg.Add(1)
	stop := Await(w.backend, h, func(exit Exit, err error) {
		defer w.wg.Done()
		if slot {
			defer func() { <-w.slots }()
		}
		w.envEnded(ctx, a, e, exit, err)
	})
	w.mu.Lock()
	e.stop = stop
	var cause error
	switch {
	case w.stopped: // the worker stopped while this environment started
		cause = context.Canceled
	case e.released: // another worker took its key meanwhile (release)
		cause = errReleased
	}
	w.mu.Unlock()
	if cause != nil {
		stop(cause)
	}
}

// stopWatches stops watching every environment, so Run can return: each keeps running, to be
// adopted on restart. Environments watched from now on are stopped at once.
func (w *Worker) stopWatches() {
	w.mu.Lock()
	w.stopped = true
	var stops []func(error)
	for _, e := range w.envs {
		if e.stop != nil {
			stops = append(stops, e.stop)
		}
	}
	w.mu.Unlock()
	for _, stop := range stops {
		stop(context.Canceled)
	}
}

// release stops watching e: another worker holds its key (errReleased). Before its watch
// began it marks e, and watch stops it as soon as it begins.
func (w *Worker) release(e *env) {
	w.mu.Lock()
	stop := e.stop
	e.released = stop == nil
	w.mu.Unlock()
	if stop != nil {
		stop(errReleased)
	}
}

// watched is what watch keeps of the assignment whose environment it watches.
type watched struct {
	task  assignment.TaskID
	epoch assignment.Epoch
	seq   uint64
}

// envEnded fails a's assignment if its job had not completed when its environment e ended
// (exit, or err from the backend's wait), destroys the environment and deletes its key. err
// is errReleased when another worker adopted e, and context.Canceled when the worker stopped.
func (w *Worker) envEnded(ctx context.Context, a watched, e *env, exit Exit, err error) {
	h := e.h
	logger := w.cfg.Log.With().Int64(logkey.TaskID, int64(a.task)).Uint64(logkey.Epoch, uint64(a.epoch)).Str(logkey.Env, h.ID).Logger()
	if ctx.Err() != nil {
		// Shutting down: the environment keeps running and is adopted on restart. It stays
		// in envs for leave to delete its key.
		return
	}
	if errors.Is(err, errReleased) {
		// Another worker adopted it (this one was cut off from NATS): the key is its.
		w.unwatch(a.task, e)
		return
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		exit = Exit{Code: -1, Reason: err.Error()}
	}
	cur, gerr := w.ended(ctx, a)
	// A GitHub runner that exits 0 ran its job (or was told to stop): GitHub's messages
	// say how the job ended, which may come after the runner exited.
	githubDone := cur.GitHub() && exit.Code == 0 && err == nil
	if gerr == nil && cur.Epoch() == a.epoch && cur.Active() && !githubDone {
		reason := fmt.Sprintf("the environment ended (%s, exit code %d) before the job completed", exit.Reason, exit.Code)
		if errors.Is(err, ErrNotFound) {
			reason = "the environment disappeared before the job completed"
		} else if d, ok := w.backend.(Diagnoser); ok {
			if why, derr := d.Diagnose(ctx, h); derr == nil && why != "" {
				reason += ": " + strings.TrimPrefix(why, "dynrunner ")
			}
		}
		next, aerr := w.log.Apply(ctx, assignment.Event{Transition: assignment.Failed, Task: a.task, Epoch: a.epoch,
			Actor: w.cfg.Actor, At: w.cfg.Now(), Reason: reason, Lost: lostEnvironment(exit)}, &cur)
		if aerr == nil {
			w.view.Observe(next)
			logger.Warn().Str("reason", reason).Msg("assignment failed")
		}
	}
	if derr := w.backend.Destroy(context.WithoutCancel(ctx), h); derr != nil {
		logger.Error().Err(derr).Msg("destroy environment")
	} else {
		logger.Info().Str("exit", exit.Reason).Int("code", exit.Code).Msg("environment destroyed")
	}
	w.unclaim(context.WithoutCancel(ctx), e.key, w.unwatch(a.task, e))
}

// ended returns the assignment of an environment that ended: from the view when it already
// shows the assignment no longer active at a's epoch, or at a later epoch (both final: an
// epoch that stopped being active never is again, and epochs only grow), else read from
// JetStream, since a job that has not completed is failed on what it says. Most environments
// end after their job completed, which the view has seen: they cost no read.
func (w *Worker) ended(ctx context.Context, a watched) (assignment.State, error) {
	if cur, ok := w.view.Get(a.task); ok && cur.Seq > a.seq && (cur.Epoch() != a.epoch || !cur.Active()) {
		return cur, nil
	}
	return w.log.Get(ctx, a.task)
}

// Refresher is implemented by backends that can replace an environment's secret files while
// it runs, atomically, each file at a time. The worker renews a development-CA SVID with every
// lease renewal through it, so no SVID outlives the lease.
type Refresher interface {
	Refresh(ctx context.Context, h Handle, files map[string][]byte) error
}

// renewIdentity renews e's identity files for st's lease unless they were issued for it, or
// for a later one, already.
func (w *Worker) renewIdentity(e *env, st assignment.State) {
	w.mu.Lock()
	if !st.LeaseExpires.After(e.until) {
		w.mu.Unlock()
		return
	}
	e.until = st.LeaseExpires
	w.mu.Unlock()
	w.refresh(st, e.h)
}

// refresh gives the environment h new identity files valid until st's lease ends. It runs on
// the view's goroutine (a signature and a few small files); on error the environment's current
// SVID stays valid until the lease it was issued for ends, and the next renewal tries again.
func (w *Worker) refresh(st assignment.State, h Handle) {
	r, ok := w.backend.(Refresher)
	if !ok || w.cfg.Identity == nil {
		return
	}
	logger := w.cfg.Log.With().Int64(logkey.TaskID, int64(st.Task)).Uint64(logkey.Epoch, uint64(st.Epoch())).Str(logkey.Env, h.ID).Logger()
	files, err := w.cfg.Identity.Files(st.Task, st.Epoch(), st.LeaseExpires)
	if err == nil && len(files) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = r.Refresh(ctx, h, files)
	}
	if err != nil {
		logger.Warn().Err(err).Msg("renew the environment's identity files with its lease")
		return
	}
	logger.Debug().Time("not_after", st.LeaseExpires).Msg("identity files renewed with the lease")
}

func (w *Worker) forget(task assignment.TaskID) {
	w.mu.Lock()
	delete(w.envs, task)
	w.mu.Unlock()
}

// unwatch forgets e, the environment the worker watched for task, and returns the revision
// of its key this worker last wrote.
func (w *Worker) unwatch(task assignment.TaskID, e *env) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.envs[task] == e {
		delete(w.envs, task)
	}
	return e.rev
}

// watching reports whether the worker still watches e for task.
func (w *Worker) watching(task assignment.TaskID, e *env) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.envs[task] == e
}

// onChange ends the environment of an assignment that ended or failed elsewhere (a lease
// expired, the job was cancelled): its end is reported (Await), and envEnded cleans up. A
// renewed lease renews the environment's identity files with it.
func (w *Worker) onChange(st assignment.State) {
	w.mu.Lock()
	e, ok := w.envs[st.Task]
	w.mu.Unlock()
	if st.Active() {
		if ok && e.h.ID != "" && e.h.Epoch == st.Epoch() && st.Transition == assignment.Renewed {
			w.renewIdentity(e, st)
		}
		return
	}
	if ok && e.h.ID != "" && e.h.Epoch == st.Epoch() && (st.Transition == assignment.Completed || st.Transition == assignment.Failed) {
		w.cfg.Metrics.ended(st) // the end itself, once: closed and reporting follow a failure
	}
	// A reservation without a handle is still starting: its `started` append fails on the
	// ended assignment and the start path destroys the environment itself.
	if ok && e.h.ID != "" && st.Phase != assignment.Completed {
		// A completed job's runner exits by itself; anything else is stopped now.
		go func() { _ = w.backend.Destroy(context.Background(), e.h) }()
	}
}

// sweep adopts the environments live assignments own and no other worker watches (their key
// in eventlog.BucketWorkers is absent, or this worker's), and destroys the environments no live
// assignment owns. It returns when the first key of another worker it left environments to
// expires unless renewed (zero when it left none): the next sweep is due then.
//
// Each environment is read when its turn comes, not all up front: adopting one makes its task
// this worker's for the environments of the same task listed after it.
func (w *Worker) sweep(ctx context.Context) (time.Time, error) {
	hs, err := w.backend.List(ctx)
	if err != nil {
		return time.Time{}, err
	}
	var recheck time.Time
	for _, h := range hs {
		e := sweepEnv{h: h, mine: w.owns(h.Task)}
		if !e.mine {
			e.st, e.known = w.view.Get(h.Task)
		}
		plan := planSweep(e)
		if plan == sweepReap && !e.mine {
			plan = w.confirmReap(ctx, &e)
		}
		switch plan {
		case sweepMine, sweepYoung:
		case sweepAdopt:
			if w.draining.Load() {
				// A draining worker takes nothing new, orphans included: it may be removed
				// as soon as it holds nothing. A worker that takes work adopts them; this
				// one looks again soon, in case its cordon is lifted.
				if soon := w.cfg.Now().Add(orphanRecheck); recheck.IsZero() || soon.Before(recheck) {
					recheck = soon
				}
				continue
			}
			if expires, left := w.adopt(ctx, e.st, h); left && (recheck.IsZero() || expires.Before(recheck)) {
				recheck = expires
			}
		case sweepReap:
			w.cfg.Log.Info().Int64(logkey.TaskID, int64(h.Task)).Str(logkey.Env, h.ID).Msg("reaping environment no live assignment owns")
			if err := w.backend.Destroy(ctx, h); err != nil {
				w.cfg.Log.Warn().Err(err).Str(logkey.Env, h.ID).Msg("reap")
			}
		}
	}
	return recheck, nil
}

// confirmReap plans again for an environment the view says no live assignment owns, on its
// assignment read from JetStream now: the view may lag behind, or lack an assignment claimed
// a moment before it started (the live index is written after the claim), and an environment
// is destroyed only when JetStream agrees. Without an answer the environment is left to the
// next sweep.
func (w *Worker) confirmReap(ctx context.Context, e *sweepEnv) sweepAction {
	st, err := w.log.Get(ctx, e.h.Task)
	switch {
	case errors.Is(err, assignment.ErrNotFound):
		return sweepReap
	case err != nil:
		w.cfg.Log.Warn().Err(err).Int64(logkey.TaskID, int64(e.h.Task)).Str(logkey.Env, e.h.ID).
			Msg("environment not reaped: its assignment could not be read")
		return sweepYoung
	}
	e.st, e.known = st, true
	return planSweep(*e)
}

// adopt watches the environment h that st records unless another worker watches it. When it
// leaves h to another worker, it returns when that worker's key expires unless renewed, and
// true.
func (w *Worker) adopt(ctx context.Context, st assignment.State, h Handle) (time.Time, bool) {
	logger := w.cfg.Log.With().Int64(logkey.TaskID, int64(h.Task)).Uint64(logkey.Epoch, uint64(h.Epoch)).Str(logkey.Env, h.ID).Logger()
	key := envKey(h.Task, h.Epoch)
	// Look before reserving: most environments another worker watches, and a reservation
	// would make this worker drop a dispatch of the task meanwhile.
	c, err := w.watcher(ctx, key)
	if err == nil && (c.actor == "" || c.actor == w.cfg.Actor) {
		if !w.reserve(h.Task) {
			return time.Time{}, false // a dispatch is adopting it right now
		}
		if c, err = w.claim(ctx, key); err != nil || c.rev == 0 {
			w.forget(h.Task)
		}
	}
	if err != nil {
		logger.Warn().Err(err).Msg("environment not adopted: who watches it is unknown")
		return time.Time{}, false
	}
	if c.rev == 0 {
		logger.Debug().Str("watcher", c.actor).Msg("environment watched by another worker")
		return c.expires, true
	}
	// An adopted environment takes a slot if one is free; with a lowered concurrency there
	// may be more environments than slots, and they are adopted all the same.
	slot := false
	select {
	case w.slots <- struct{}{}:
		slot = true
	default:
	}
	logger.Info().Str("started_by", st.StartedBy).Msg("environment adopted")
	w.watch(ctx, st, h, slot, c.rev)
	return time.Time{}, false
}

// sweepMargin is how long after an environment's key would expire the sweep that adopts the
// environment runs, so the server has removed the key by then.
const sweepMargin = time.Second

// reapLoop sweeps every Reap, and sooner when the key of an environment the last sweep left to
// another worker expires sooner: after a crash (a SIGKILLed controller, whose restart has a
// new actor) the crashed worker's environments are adopted as soon as their keys are gone.
func (w *Worker) reapLoop(ctx context.Context, recheck time.Time) {
	for {
		d := w.cfg.Reap
		if !recheck.IsZero() {
			d = min(d, max(time.Until(recheck)+sweepMargin, sweepMargin))
		}
		_ = clock.Sleep(ctx, d)
		if ctx.Err() != nil {
			return
		}
		var err error
		if recheck, err = w.sweep(ctx); err != nil && ctx.Err() == nil {
			w.cfg.Log.Warn().Err(err).Msg("reap")
		}
	}
}
