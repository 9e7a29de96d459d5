package scheduler

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dynrunner/dynrunner/forge"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/grants"
	"github.com/dynrunner/dynrunner/internal/lease"
	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
)

// Config configures the Scheduler. Durations are validated by the caller (cmd).
type Config struct {
	// Actor names this scheduler instance in the event log.
	Actor string
	// Backends are the enabled isolation tiers.
	Backends []assignment.Backend
	// Capacity is how many live assignments each tier takes (its workers' concurrency across
	// the fleet). The scheduler fetches no task while every enabled tier is full, so claims do
	// not pile up behind busy environments and time out.
	Capacity map[assignment.Backend]int
	// CapacityOf, when set, replaces Capacity at each decision: the capacity the workers online
	// announce (ADMIT_CAPACITY=workers), so admission follows a fleet that scales. It returns
	// false when it cannot tell (the heartbeats could not be read); the scheduler then admits
	// nothing and fetches nothing until it can.
	CapacityOf func() (map[assignment.Backend]int, bool)
	// Lease is how long an assignment lives without renewal; Pickup how long a claim may wait
	// for its environment's runner to fetch the task (below Lease).
	Lease, Pickup time.Duration
	// FetchInterval is the pause between empty FetchTask polls, backing off to FetchIntervalMax
	// on errors.
	FetchInterval, FetchIntervalMax time.Duration
	// Keepalive is how often a task whose environment is still starting is reported alive
	// upstream (Gitea fails tasks silent for 10 minutes).
	Keepalive time.Duration
	// Reconcile is how often live assignments are checked for overdue deadlines.
	Reconcile time.Duration
	// Sweep is how often what ended assignments left in JetStream (their keys in the live
	// index, their sealed tasks) is looked for and removed (DefaultSweep, when zero).
	Sweep time.Duration
	// ForgeURL is the forge's URL for tasks that do not name their own (Gitea's task context
	// carries its ROOT_URL as server_url): GITEA_URL.
	ForgeURL assignment.ForgeURL
	// Admission configures the admission queue, its fairness and share cap (MAX_QUEUED,
	// QUEUE_SECS, FAIRNESS, FAIR_SHARE_CAP); the zero value is no queue.
	Admission Admission
	// Grants is GRANTS_FILE's policy: a job whose tier its grant does not allow is failed
	// upstream with a message naming the grant, and never claimed. Nil grants every tier.
	Grants  *grants.Policy
	Box     *sealbox.Box
	Log     zerolog.Logger
	Now     func() time.Time
	Metrics *Metrics
}

// Scheduler claims forge tasks and drives assignments to their end.
type Scheduler struct {
	cfg   Config
	forge forge.Forge
	log   EventLog
	view  View
	// lease is the reconcile lease: only its holder among the scheduler replicas reconciles.
	lease *lease.Lease

	started time.Time // when Run began; deadlines wait a grace period after it

	swept time.Time // when reconcile last ran the sweep

	mu        sync.Mutex
	keptAlive map[assignment.TaskID]time.Time
	dropped   map[assignment.TaskID]bool
	ready     chan struct{}
	readyOnce sync.Once
}

// LeaseHeld reports whether this replica holds the reconcile lease now (for its heartbeat and
// `dynrunner status`).
func (s *Scheduler) LeaseHeld() bool { return s.lease.Held() }

// New returns a Scheduler. view must be fed by a running eventlog Watch.
func New(cfg Config, forge forge.Forge, log EventLog, view View) *Scheduler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	held := cfg.Metrics.LeaseHeld
	reconcile := lease.New(log.Leases(), LeaseReconcile, cfg.Actor, log.Config().LeasesTTL,
		cfg.Log.With().Str("lease", LeaseReconcile).Logger(), func(h bool) {
			if h {
				held.Set(1)
			} else {
				held.Set(0)
			}
		})
	if cfg.Sweep <= 0 {
		cfg.Sweep = DefaultSweep
	}
	return &Scheduler{
		cfg: cfg, forge: forge, log: log, view: view, lease: reconcile,
		keptAlive: make(map[assignment.TaskID]time.Time),
		dropped:   make(map[assignment.TaskID]bool),
		ready:     make(chan struct{}),
	}
}

// Ready is closed once the scheduler has caught up with the event log and either fetched from
// the forge once or paused its fetching (a tier full, or with an admission queue a tier's queue
// full: it does not fetch until that changes). While the capacity is unknown (CapacityOf has
// not read it yet) it is not ready.
func (s *Scheduler) Ready() <-chan struct{} { return s.ready }

// Run fetches tasks and reconciles assignments until ctx ends. It returns nil on cancellation.
// Every replica fetches and claims; only the holder of the reconcile lease reconciles.
func (s *Scheduler) Run(ctx context.Context) error {
	select {
	case <-s.view.Ready():
	case <-ctx.Done():
		return nil
	}
	s.started = s.cfg.Now()
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.lease.Run(ctx) })
	wg.Go(func() { s.reconcileLoop(ctx) })
	s.fetchLoop(ctx)
	wg.Wait()
	return nil
}

func (s *Scheduler) fetchLoop(ctx context.Context) {
	var version int64
	wait := time.Duration(0)
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		capacity, known := s.capacity()
		if !known {
			wait = s.cfg.FetchInterval
			continue
		}
		if (len(capacity) > 0 || s.cfg.Admission.Enabled()) &&
			paused(count(s.view.LiveStates(), false), capacity, s.cfg.Backends, s.cfg.Admission) {
			// Paused (a tier is full): not fetching is this scheduler's work now, so it is
			// ready (a busy fleet's rolling restart must not wait for a slot to free).
			s.readyOnce.Do(func() { close(s.ready) })
			wait = s.cfg.FetchInterval
			continue
		}
		resp, err := s.forge.FetchTask(ctx, version)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.cfg.Metrics.FetchErrors.Inc()
			wait = backoff(wait, s.cfg.FetchInterval, s.cfg.FetchIntervalMax)
			s.cfg.Log.Warn().Err(err).Dur("retry_in", wait).Msg("fetch task failed")
			continue
		}
		s.readyOnce.Do(func() { close(s.ready) })
		task := resp.GetTask()
		if task == nil {
			version = resp.GetTasksVersion()
			wait = s.cfg.FetchInterval
			continue
		}
		// A task came: ask again at once with version 0, so Gitea looks for more queued jobs
		// rather than answering "nothing changed since this version".
		version, wait = 0, 0
		if err := s.accept(ctx, task); err != nil && ctx.Err() == nil {
			s.cfg.Log.Error().Err(err).Int64(logkey.TaskID, task.GetId()).Msg("task not accepted")
		}
	}
}

func backoff(cur, base, max time.Duration) time.Duration {
	next := 2 * cur
	if next < base {
		next = base
	}
	if next > max {
		next = max
	}
	// Up to 20% jitter so many schedulers do not poll in lockstep.
	return next - time.Duration(rand.Int64N(int64(next)/5+1))
}

// accept routes a fetched task and persists its complete assignment before any other action.
func (s *Scheduler) accept(ctx context.Context, task *runnerv1.Task) error {
	id := assignment.TaskID(task.GetId())
	logger := s.cfg.Log.With().Int64(logkey.TaskID, task.GetId()).Logger()
	if id <= 0 {
		return fmt.Errorf("scheduler: forge sent a task without an id")
	}
	job, err := ParseJob(task.GetWorkflowPayload())
	var backend assignment.Backend
	if err == nil {
		backend, err = Route(job.RunsOn, s.cfg.Backends)
	}
	fork := forkOf(task)
	if err == nil {
		err = s.cfg.Grants.Check(grants.Subject{Repo: repoOf(task), Fork: fork}, backend)
	}
	if err != nil {
		s.cfg.Metrics.Rejected.Inc()
		logger.Warn().Err(err).Msg("task rejected")
		return s.failUpstream(ctx, id, []string{
			"dynrunner: this job was not run: " + err.Error(),
		})
	}
	sealed, digest, err := sealedtask.Seal(s.cfg.Box, id, task)
	if err != nil {
		return fmt.Errorf("scheduler: seal task %d: %w", id, err)
	}
	var queue time.Duration
	capacity, known := s.capacity()
	if s.cfg.Admission.Enabled() && (!known ||
		queueOnClaim(count(s.view.LiveStates(), s.cfg.Admission.ShareCap > 0), capacity, s.cfg.Admission, backend, assignment.OwnerOf(repoOf(task)))) {
		queue = s.cfg.Admission.Queue
	}
	var st assignment.State
	err = s.persist(ctx, func() error {
		if err := s.log.PutTask(ctx, id, sealed); err != nil {
			return err
		}
		var err error
		st, err = s.log.Apply(ctx, assignment.Event{
			Transition: assignment.Claimed, Task: id, Actor: s.cfg.Actor, At: s.cfg.Now(),
			Backend: backend, Repo: repoOf(task), Job: job.Name, RunsOn: UniqueLabels(job.RunsOn), Fork: fork, ForgeURL: s.forgeURLOf(task, logger),
			TaskDigest: digest, Lease: s.cfg.Lease, Pickup: s.cfg.Pickup, Queue: queue,
		}, nil)
		if errors.Is(err, assignment.ErrExists) {
			// A retried claim whose first append landed, or another scheduler's claim: the
			// sealed task's digest (its seal is random) tells which.
			if st, err = s.log.Get(ctx, id); err == nil && st.TaskDigest != digest {
				err = fmt.Errorf("scheduler: task %d is claimed by %s: %w", id, st.Actor, errClaimedElsewhere)
			}
		}
		return err
	})
	if errors.Is(err, errClaimedElsewhere) || errors.Is(err, assignment.ErrExists) {
		// Another scheduler claimed the task (PutTask refuses to overwrite its sealed task;
		// the claim's compare-and-swap refuses a second claim). It is that one's to run, and
		// nothing here may touch it: no drop, no report.
		logger.Warn().Err(err).Msg("task claimed by another scheduler; leaving it to that one")
		if errors.Is(err, errClaimedElsewhere) && !st.Live() {
			// The other claim ended and its sealed task was dropped before this one stored
			// its own: drop that.
			_ = s.log.DropTask(ctx, id)
		}
		return nil
	}
	if err != nil {
		// The forge handed the task to us; rather than leave it to Gitea's zombie timeout,
		// say why it cannot run.
		logger.Error().Err(err).Msg("could not persist the assignment; failing the task upstream")
		_ = s.log.DropTask(context.WithoutCancel(ctx), id)
		return errors.Join(err, s.failUpstream(context.WithoutCancel(ctx), id, []string{
			"dynrunner: this job was not run: the assignment could not be persisted to JetStream: " + err.Error(),
		}))
	}
	s.view.Observe(st)
	s.cfg.Metrics.Claimed.WithLabelValues(string(backend)).Inc()
	if st.Phase == assignment.Queued {
		logger.Info().Str(logkey.Backend, string(backend)).Uint64(logkey.Epoch, uint64(st.Epoch())).
			Str("repo", st.Repo).Str("job", st.Job).Time("queue_deadline", st.QueueDeadline).Msg("task claimed and queued: it waits for capacity")
		return nil // the reconciler admits it when capacity frees
	}
	logger.Info().Str(logkey.Backend, string(backend)).Uint64(logkey.Epoch, uint64(st.Epoch())).
		Str("repo", st.Repo).Str("job", st.Job).Msg("task claimed")
	return s.log.Dispatch(ctx, backend, id, st.Epoch())
}

// capacity is the capacity per tier decisions use now: Config.CapacityOf's when set, else
// Config.Capacity; false when CapacityOf cannot tell.
func (s *Scheduler) capacity() (map[assignment.Backend]int, bool) {
	if s.cfg.CapacityOf == nil {
		return s.cfg.Capacity, true
	}
	return s.cfg.CapacityOf()
}

// admit gives queued claims the capacity that freed (planAdmit) and dispatches them. A
// failed admission is tried again at the next pass; a failed dispatch is published again by
// the reconciler (the admitted claim is in phase claimed).
func (s *Scheduler) admit(ctx context.Context, live iter.Seq[assignment.State], now time.Time) {
	capacity, known := s.capacity()
	if !known {
		return
	}
	for _, st := range planAdmit(live, capacity, s.cfg.Admission, now) {
		next, err := s.log.Apply(ctx, assignment.Event{Transition: assignment.Admitted, Task: st.Task, Epoch: st.Epoch(),
			Actor: s.cfg.Actor, At: now, Pickup: s.cfg.Pickup, Lease: s.cfg.Lease}, &st)
		if errors.Is(err, assignment.ErrNoChange) {
			continue
		}
		logger := s.cfg.Log.With().Int64(logkey.TaskID, int64(st.Task)).Uint64(logkey.Epoch, uint64(st.Epoch())).Logger()
		if err != nil {
			if ctx.Err() == nil {
				logger.Warn().Err(err).Msg("admit queued task")
			}
			continue
		}
		s.view.Observe(next)
		waited := now.Sub(st.ClaimedAt)
		s.cfg.Metrics.observeAdmission(st, waited)
		logger.Info().Str(logkey.Backend, string(st.Backend)).Str("repo", st.Repo).Str("job", st.Job).
			Dur("waited", waited).Msg("task admitted")
		if err := s.log.Dispatch(ctx, st.Backend, st.Task, st.Epoch()); err != nil && ctx.Err() == nil {
			logger.Warn().Err(err).Msg("dispatch admitted task; the reconciler publishes it again")
		}
	}
}

// persistFor bounds how long a claim is retried against an unavailable JetStream.
const persistFor = time.Minute

// persist retries fn (an idempotent write) with backoff for up to persistFor. An error that
// no retry can change (the task is larger than the event bus takes; the claim is invalid) ends
// it at once, so one such task holds up no other.
func (s *Scheduler) persist(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(persistFor)
	wait := 100 * time.Millisecond
	for {
		err := fn()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || terminal(err) {
			return err
		}
		s.cfg.Log.Warn().Err(err).Dur("retry_in", wait).Msg("persist assignment")
		if err := clock.Sleep(ctx, wait); err != nil {
			return err
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// errClaimedElsewhere: the task's assignment is another scheduler's claim.
var errClaimedElsewhere = errors.New("claimed by another scheduler")

// terminal reports whether err cannot go away on retry.
func terminal(err error) bool {
	return errors.Is(err, eventlog.ErrTooLarge) || errors.Is(err, assignment.ErrInvalidTransition) ||
		errors.Is(err, assignment.ErrExists) || errors.Is(err, errClaimedElsewhere)
}

func repoOf(t *runnerv1.Task) string {
	if c := t.GetContext(); c != nil {
		return c.GetFields()["repository"].GetStringValue()
	}
	return ""
}

// forkOf reports whether a task runs for a pull request from a fork: a pull_request* event
// whose head repository is not its base repository. A pull request event without a readable
// head or base repository counts as a fork, so the forks bound of GRANTS_FILE fails closed.
func forkOf(t *runnerv1.Task) bool {
	fields := t.GetContext().GetFields()
	if !strings.HasPrefix(fields["event_name"].GetStringValue(), "pull_request") {
		return false
	}
	pr := fields["event"].GetStructValue().GetFields()["pull_request"].GetStructValue().GetFields()
	repoName := func(side string) string {
		repo := pr[side].GetStructValue().GetFields()["repo"].GetStructValue().GetFields()
		return strings.ToLower(repo["full_name"].GetStringValue())
	}
	head, base := repoName("head"), repoName("base")
	return head == "" || base == "" || head != base
}

// forgeURLOf returns the forge URL the task's job is to see: the server_url of its context (Gitea's
// ROOT_URL), or Config.ForgeURL when the task names none or a malformed one.
func (s *Scheduler) forgeURLOf(t *runnerv1.Task, logger zerolog.Logger) assignment.ForgeURL {
	raw := t.GetContext().GetFields()["server_url"].GetStringValue()
	if raw == "" {
		return s.cfg.ForgeURL
	}
	u, err := assignment.ParseForgeURL(raw)
	if err != nil {
		logger.Warn().Err(err).Str("fallback", s.cfg.ForgeURL.String()).Msg("the task's server_url is malformed; its job sees GITEA_URL instead")
		return s.cfg.ForgeURL
	}
	return u
}

func (s *Scheduler) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.Reconcile)
	defer t.Stop()
	for {
		s.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reconcile drives every live assignment that needs the scheduler: redispatch, keepalive,
// deadlines, failure reports, and dropping the secret material of ended ones. Only the holder
// of the reconcile lease does; each assignment is reconciled under a context that ends with
// the holder's belief in the lease, so a holder that paused past it sends nothing more.
func (s *Scheduler) reconcile(ctx context.Context) {
	now := s.cfg.Now()
	l := count(s.view.LiveStates(), true)
	s.cfg.Metrics.observeLoad(l)
	if s.cfg.Admission.Enabled() {
		if lctx, cancel, held := s.lease.Context(ctx); held {
			s.admit(lctx, s.view.LiveStates(), now)
			cancel()
		}
	}
	// Ended assignments stay in the view for an hour (and at most eventlog.MaxEnded of them)
	// so late reports get a clear answer without a read; older ones were dropped before (or
	// expire with the bucket's max age, or the sweep removes them), so forget them first.
	for _, id := range s.view.Forget(now.Add(-forgetAfter)) {
		s.mu.Lock()
		delete(s.dropped, id)
		s.mu.Unlock()
	}
	// Only the live assignments' ids are copied; each state is read as it is reconciled (the
	// view's latest, not a snapshot's: every append is compare-and-swap either way), so a pass
	// over 10,000 live assignments does not copy 10,000 states at once.
	tasks := s.view.LiveTasks()
	s.cfg.Metrics.Live.Set(float64(len(tasks)))
	for _, task := range tasks {
		if ctx.Err() != nil || !s.lease.Held() {
			return // done, or another replica reconciles
		}
		st, ok := s.view.Get(task)
		if !ok || !st.Live() {
			continue
		}
		err := s.reconcileOne(ctx, st, now)
		if errors.Is(err, errNotHeld) {
			return // another replica reconciles
		}
		if err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn().Err(err).Int64(logkey.TaskID, int64(st.Task)).Uint64(logkey.Epoch, uint64(st.Epoch())).
				Str("phase", string(st.Phase)).Msg("reconcile")
		}
	}
	lctx, cancel, held := s.lease.Context(ctx)
	if !held {
		return
	}
	defer cancel()
	s.dropEnded(lctx)
	if now.Sub(s.swept) >= s.cfg.Sweep {
		s.swept = now
		n, err := s.log.Sweep(lctx)
		if err != nil && lctx.Err() == nil {
			s.cfg.Log.Warn().Err(err).Int("removed", n).Msg("sweep what ended assignments left")
		} else if n > 0 {
			s.cfg.Log.Info().Int("removed", n).Msg("swept what ended assignments left")
		}
	}
}

// errNotHeld: this replica does not hold the reconcile lease, so it must not act.
var errNotHeld = errors.New("scheduler: the reconcile lease is not held")

// DefaultSweep is how often the scheduler sweeps by default (Config.Sweep).
const DefaultSweep = 10 * time.Minute

// giveUpReporting is how long a failure report is retried before the assignment is closed
// without it.
const giveUpReporting = 15 * time.Minute

// forgetAfter is how long an ended assignment stays in the in-memory view.
const forgetAfter = time.Hour

// reconcileOne reconciles one live assignment: it asks planReconcile what st needs and does it,
// under the reconcile lease (errNotHeld when this replica does not hold it).
func (s *Scheduler) reconcileOne(ctx context.Context, st assignment.State, now time.Time) error {
	s.mu.Lock()
	keptAlive := s.keptAlive[st.Task]
	s.mu.Unlock()
	plan := planReconcile(reconcileSnapshot{st: st, now: now, started: s.started, lease: s.cfg.Lease,
		keptAlive: keptAlive, every: s.cfg.Keepalive})
	if len(plan) == 0 {
		return nil // most assignments, most passes: no context, no timer, no copy on the heap
	}
	return s.act(ctx, st, plan, now)
}

// act does what planReconcile planned for st, under the reconcile lease. It is reconcileOne's
// second half so that only an assignment with something to do has its state moved to the heap
// (the appends take its address).
func (s *Scheduler) act(ctx context.Context, st assignment.State, plan []reconcileAction, now time.Time) error {
	ctx, cancel, held := s.lease.Context(ctx)
	if !held {
		return errNotHeld
	}
	defer cancel()
	for _, a := range plan {
		switch a.kind {
		case reconcileFail:
			ev := a.ev
			ev.Actor = s.cfg.Actor
			next, err := s.log.Apply(ctx, ev, &st)
			if errors.Is(err, assignment.ErrNotDue) {
				// The view was behind (a renewal or the fetch it had not seen yet): the
				// assignment, read again, met its deadline.
				s.cfg.Log.Info().Int64(logkey.TaskID, int64(st.Task)).Uint64(logkey.Epoch, uint64(st.Epoch())).
					Str("reason", ev.Reason).Msg("deadline seen passed in a stale view; the assignment met it")
				if next.Seq > st.Seq {
					s.view.Observe(next)
				}
				return nil
			}
			if errors.Is(err, assignment.ErrNoChange) {
				return nil
			}
			if err != nil {
				return err
			}
			s.view.Observe(next)
			s.cfg.Log.Warn().Int64(logkey.TaskID, int64(st.Task)).Uint64(logkey.Epoch, uint64(st.Epoch())).Str("reason", next.Reason).Msg("assignment failed")
			st = next
		case reconcileClose:
			if err := s.closeFailed(ctx, st); err != nil {
				return err
			}
		case reconcileRedispatch:
			if err := s.log.Dispatch(ctx, st.Backend, st.Task, st.Epoch()); err != nil {
				return err
			}
		case reconcileKeepalive:
			if err := s.keepalive(ctx, st, now); err != nil {
				return err
			}
		}
	}
	return nil
}

// keepalive tells the forge the task is alive while its environment starts, and notices a
// cancellation made in the forge meanwhile.
func (s *Scheduler) keepalive(ctx context.Context, st assignment.State, now time.Time) error {
	s.mu.Lock()
	s.keptAlive[st.Task] = now
	s.mu.Unlock()
	resp, err := s.forge.UpdateTask(ctx, &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: int64(st.Task)}})
	if err != nil {
		return fmt.Errorf("scheduler: keepalive: %w", err)
	}
	if resp.GetState().GetResult() == runnerv1.Result_RESULT_CANCELLED {
		next, err := s.log.Apply(ctx, assignment.Event{Transition: assignment.Failed, Task: st.Task, Epoch: st.Epoch(),
			Actor: s.cfg.Actor, At: now, Reason: "cancelled in the forge before the job started"}, &st)
		if err != nil && !errors.Is(err, assignment.ErrNoChange) {
			return err
		}
		s.view.Observe(next)
	}
	return nil
}

// reportFor is how long a claim on a failure report (`reporting`) holds. The reporter's calls to
// the forge end before half of it has passed by its own clock; only after all of it may
// another scheduler take the report over, so the two never both report (clocks of the
// replicas within reportFor/2 of each other, as the assignments' leases already assume).
const reportFor = time.Minute

// closeFor bounds the append of `closed` after a report.
const closeFor = 10 * time.Second

// closeFailed reports a failed assignment upstream, then records that it was reported. The
// report is claimed in the event log first (`reporting`, by compare-and-swap): of two schedulers
// that both believe they should report it (a holder of the reconcile lease that paused past it,
// and its successor), one claims it and the other finds it claimed.
func (s *Scheduler) closeFailed(ctx context.Context, st assignment.State) error {
	began := time.Now() // the monotonic clock bounds the reporter's calls
	claim, err := s.log.Apply(ctx, assignment.Event{Transition: assignment.Reporting, Task: st.Task, Epoch: st.Epoch(),
		Actor: s.cfg.Actor, At: s.cfg.Now(), Lease: reportFor}, &st)
	if errors.Is(err, assignment.ErrReportClaimed) || errors.Is(err, assignment.ErrTerminal) {
		if claim.Seq != 0 {
			s.view.Observe(claim)
		}
		return nil // another scheduler reports it, or did
	}
	if err != nil {
		return err
	}
	s.view.Observe(claim)
	rctx, cancel := context.WithDeadline(ctx, began.Add(reportFor/2))
	defer cancel()
	if err := s.failUpstream(rctx, st.Task, []string{"dynrunner: the job failed: " + st.Reason}); err != nil {
		// The forge may never accept the report (the task was deleted, the runner
		// re-registered). Give up after a while rather than keep the assignment and its
		// secret material forever. Until then the claim runs out and the report is claimed
		// again.
		failedAt := st.FailedAt
		if failedAt.IsZero() { // recorded by an older release
			failedAt = st.At
		}
		if s.cfg.Now().Sub(failedAt) < giveUpReporting {
			return err
		}
		s.cfg.Log.Error().Err(err).Int64(logkey.TaskID, int64(st.Task)).Msg("the forge did not take the failure report; closing the assignment anyway")
	}
	// Record the report even if the lease's context ended meanwhile: `closed` is a
	// compare-and-swap append, and without it the report would be claimed and sent again once
	// this claim ran out.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), closeFor)
	defer ccancel()
	next, err := s.log.Apply(cctx, assignment.Event{Transition: assignment.Closed, Task: st.Task, Epoch: st.Epoch(),
		Actor: s.cfg.Actor, At: s.cfg.Now()}, &claim)
	if err != nil && !errors.Is(err, assignment.ErrNoChange) {
		return err
	}
	s.view.Observe(next)
	return nil
}

// dropEnded purges the sealed tasks of ended assignments. It runs from the reconciler, so an
// end recorded by another component (the facade, a worker) is cleaned up here too.
func (s *Scheduler) dropEnded(ctx context.Context) {
	for _, st := range s.view.Ended() {
		s.mu.Lock()
		done := s.dropped[st.Task]
		s.mu.Unlock()
		if done {
			continue
		}
		if err := s.log.DropTask(ctx, st.Task); err != nil {
			s.cfg.Log.Warn().Err(err).Int64(logkey.TaskID, int64(st.Task)).Msg("drop sealed task")
			continue
		}
		s.mu.Lock()
		s.dropped[st.Task] = true
		delete(s.keptAlive, st.Task)
		s.mu.Unlock()
	}
}

// failUpstream appends lines to the task's log in the forge and marks it failed. It tolerates
// a task that already has log rows (the runner ran part of it) by appending after them.
//
// It sends nothing once ctx ended: a report's context ends when its claim may pass to another
// scheduler.
func (s *Scheduler) failUpstream(ctx context.Context, id assignment.TaskID, lines []string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("scheduler: report task %d: %w", id, err)
	}
	ack, err := s.forge.UpdateLog(ctx, &runnerv1.UpdateLogRequest{TaskId: int64(id)})
	if err != nil {
		return err
	}
	now := timestamppb.New(s.cfg.Now())
	rows := make([]*runnerv1.LogRow, len(lines))
	for i, l := range lines {
		rows[i] = &runnerv1.LogRow{Time: now, Content: l}
	}
	if _, err := s.forge.UpdateLog(ctx, &runnerv1.UpdateLogRequest{TaskId: int64(id), Index: ack.GetAckIndex(), Rows: rows, NoMore: true}); err != nil {
		// The log may already be sealed by a runner that finished its part; the result still counts.
		s.cfg.Log.Warn().Err(err).Int64(logkey.TaskID, int64(id)).Msg("append failure explanation to the task log")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("scheduler: report task %d: %w", id, err)
	}
	if _, err := s.forge.UpdateTask(ctx, &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{
		Id: int64(id), Result: runnerv1.Result_RESULT_FAILURE, StartedAt: now, StoppedAt: now,
	}}); err != nil {
		return err
	}
	return nil
}
