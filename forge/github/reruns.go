package github

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Defaults of RerunsConfig.
const (
	// DefaultReruns is GITHUB_RERUNS's default: how many reruns dynrunner asks for one
	// workflow run.
	DefaultReruns = 2
	// MaxReruns bounds GITHUB_RERUNS (GitHub allows 50 attempts of a run).
	MaxReruns = 10
	// DefaultRerunPoll is how often a run waiting to complete is read at first; the interval
	// grows with the round's age, to ten times this.
	DefaultRerunPoll = 30 * time.Second
	// DefaultRerunHold is how long a claim of the call holds. The claimer's call ends within
	// half of it, by its own clock, so no other scheduler calls while it might.
	DefaultRerunHold = 2 * time.Minute
)

// rerunMaxTries is how often a round's call may fail before the round gives up; rerunMaxWait
// how long a round waits for its run to complete (GitHub reruns a run up to 30 days after it).
const (
	rerunMaxTries = 8
	rerunMaxWait  = 30 * 24 * time.Hour
)

// RerunLog is what Reruns reads of the event log: the slots' authentic records. *eventlog.Log
// is one.
type RerunLog interface {
	Get(ctx context.Context, task assignment.TaskID) (assignment.State, error)
}

// RerunsConfig configures Reruns.
type RerunsConfig struct {
	// KV is eventlog.BucketGitHubReruns.
	KV      jetstream.KeyValue
	Events  RerunLog
	Clients *Clients
	// Max is GITHUB_RERUNS: the reruns dynrunner asks for one workflow run, at most. 0 asks
	// for none and notes no loss.
	Max   int
	Actor string
	// Poll, Hold: DefaultRerunPoll, DefaultRerunHold if zero.
	Poll, Hold time.Duration
	Log        zerolog.Logger
	Metrics    *Metrics
	// Now is the clock; time.Now if nil.
	Now func() time.Time
}

// Reruns runs again the jobs of GitHub slots whose environment was lost. A slot whose job
// started (JobStarted recorded the run and repository) and that failed because its environment
// was lost, not because its job failed, is noted in its run's record (Note, by the slot's
// scale set's session holder, before the slot is closed). Every scheduler replica runs Run,
// which follows the records: it reads the run's status with the controller's credentials
// until GitHub reports the run completed, then one replica claims the call by compare-and-swap
// and calls rerun-failed-jobs, once; a claimer that died is taken over after its claim, and the
// run's attempt (run_attempt) tells whether its call went through. At most Max reruns per run.
type Reruns struct {
	cfg RerunsConfig
	// due is when each round Run follows is worked next, by this replica; failures counts
	// its failed reads of the run, for their backoff. Only Run's goroutine uses them.
	due      map[string]time.Time
	failures map[string]int
}

// NewReruns returns Reruns; Run runs it.
func NewReruns(cfg RerunsConfig) *Reruns {
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultRerunPoll
	}
	if cfg.Hold <= 0 {
		cfg.Hold = DefaultRerunHold
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return &Reruns{cfg: cfg, due: map[string]time.Time{}, failures: map[string]int{}}
}

// Wanted reports whether a slot's failure calls for a rerun of its job: it is a GitHub slot
// that took a job (JobStarted recorded its run) and failed because its environment was lost.
func Wanted(st assignment.State) bool {
	return st.GitHub() && st.Phase == assignment.Failed && st.Lost && st.GitHubJob != "" && st.RunID > 0
}

// Note records in its run's record that slot st lost its environment, unless the record has
// it already. A slot that does not call for a rerun (Wanted) is ignored. It fails, to be
// called again, while the run's rerun is being asked for and st's job started after that (a
// job of the rerun's attempt).
func (r *Reruns) Note(ctx context.Context, st assignment.State) error {
	if r.cfg.Max <= 0 || !Wanted(st) {
		return nil
	}
	if _, _, err := SplitRepo(st.Repo); err != nil {
		r.cfg.Log.Warn().Err(err).Uint64("slot", uint64(st.Task)).Int64("run", st.RunID).
			Msg("github: a slot that lost its environment names no repository to rerun its job in; not rerun")
		return nil
	}
	key := RerunKey(st.RunID)
	ev := rerunEvent{kind: rerunNote, actor: r.cfg.Actor, at: r.cfg.Now(), slot: st.Task, repo: st.Repo, run: st.RunID, runningAt: st.RunningAt}
	for range 8 {
		rec, err := r.apply(ctx, key, ev)
		switch {
		case errors.Is(err, errRerunNoChange):
			return nil
		case conflict(err):
			continue // another replica wrote the record meanwhile
		case err != nil:
			return fmt.Errorf("github: note slot %d's lost environment for a rerun of run %d: %w", st.Task, st.RunID, err)
		}
		r.cfg.Log.Info().Uint64("slot", uint64(st.Task)).Int64("run", st.RunID).Str("repo", st.Repo).Str("state", string(rec.State)).
			Msg("github: a slot's environment was lost; its job is run again once its workflow run completes")
		return nil
	}
	return fmt.Errorf("github: note slot %d's lost environment for a rerun of run %d: too many conflicting writes", st.Task, st.RunID)
}

// Run follows the records and works the rounds that are not final until ctx ends; it returns
// nil then.
func (r *Reruns) Run(ctx context.Context) error {
	for {
		if err := r.follow(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Log.Warn().Err(err).Msg("github: following the reruns; again shortly")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.Poll):
		}
	}
}

// follow watches the bucket, keeping the rounds to work in r.due, and works those due, until
// ctx ends (nil) or the watch fails.
func (r *Reruns) follow(ctx context.Context) error {
	w, err := r.cfg.KV.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("github: watch %s: %w", "the reruns", err)
	}
	defer func() { _ = w.Stop() }()
	tick := time.NewTicker(max(r.cfg.Poll/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("github: the watch of the reruns ended")
			}
			if e != nil {
				r.track(e)
			}
		case <-tick.C:
			r.pass(ctx)
		}
	}
}

// track keeps a round to work, or forgets one that is final or gone.
func (r *Reruns) track(e jetstream.KeyValueEntry) {
	key := e.Key()
	var rec Rerun
	if e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &rec) != nil || rec.Final() {
		delete(r.due, key)
		delete(r.failures, key)
	} else if _, ok := r.due[key]; !ok {
		r.due[key] = time.Time{} // now
	}
	r.cfg.Metrics.RerunsPending.Set(float64(len(r.due)))
}

// pass works every round that is due.
func (r *Reruns) pass(ctx context.Context) {
	now := r.cfg.Now()
	for key, due := range r.due {
		if ctx.Err() != nil {
			return
		}
		if now.Before(due) {
			continue
		}
		next := r.work(ctx, key)
		if _, ok := r.due[key]; ok {
			r.due[key] = next
		}
	}
}

// work does what a round needs now and returns when it is to be worked next.
func (r *Reruns) work(ctx context.Context, key string) time.Time {
	now := r.cfg.Now()
	rec, _, err := r.get(ctx, key)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			r.cfg.Log.Warn().Err(err).Str("key", key).Msg("github: read a rerun record")
		}
		return now.Add(r.cfg.Poll)
	}
	log := r.cfg.Log.With().Int64("run", rec.Run).Str("repo", rec.Repo).Logger()
	switch {
	case rec.Final():
		return now.Add(rerunMaxWait) // the watch forgets it
	case key != RerunKey(rec.Run):
		log.Error().Str("key", key).Msg("github: a rerun record names another run than its key; ignored")
		return now.Add(rerunMaxWait)
	case rec.State == RerunAsking && now.Before(rec.AskUntil):
		return rec.AskUntil // its claimer asks
	case rec.State == RerunPending && rec.Tries > 0 && now.Before(rec.At.Add(r.backoff(rec.Tries))):
		return rec.At.Add(r.backoff(rec.Tries))
	case rec.State == RerunPending && now.Sub(rec.Since) > rerunMaxWait:
		r.skip(ctx, key, OutcomeGaveUp, fmt.Sprintf("the run did not complete within %s of the loss", rerunMaxWait), log)
		return now.Add(r.cfg.Poll)
	}
	if ok, err := r.backed(ctx, rec); err != nil {
		log.Warn().Err(err).Msg("github: read the slots of a rerun record")
		return now.Add(r.cfg.Poll)
	} else if !ok {
		r.skip(ctx, key, OutcomeRefused, "no slot it names has an authentic record of a lost environment in this run", log)
		return now.Add(r.cfg.Poll)
	}
	run, err := r.cfg.Clients.GetWorkflowRun(ctx, rec.Repo, rec.Run)
	if notFound(err) {
		r.skip(ctx, key, OutcomeGone, "GitHub does not know the run (404): deleted, or the credentials cannot see it", log)
		return now.Add(r.cfg.Poll)
	}
	if err != nil {
		r.failures[key]++
		r.cfg.Metrics.RerunErrors.WithLabelValues("get_run").Inc()
		log.Warn().Err(err).Msg("github: read a workflow run to rerun")
		return now.Add(r.backoff(r.failures[key]))
	}
	delete(r.failures, key)
	p := planRerun(rec, run, now, r.cfg.Max)
	switch p.step {
	case stepObserve:
		if _, err := r.apply(ctx, key, rerunEvent{kind: rerunObserve, actor: r.cfg.Actor, at: now, attempt: run.Attempt}); err != nil && !errors.Is(err, errRerunNoChange) {
			log.Debug().Err(err).Msg("github: record a workflow run's attempt")
		}
	case stepConfirm:
		r.asked(ctx, key, rerunEvent{kind: rerunAsked, actor: r.cfg.Actor, at: now},
			fmt.Sprintf("the run is at attempt %d: the earlier call of %s, unanswered or unrecorded, went through", run.Attempt, rec.Asker), log)
	case stepSkip:
		r.skip(ctx, key, p.outcome, p.reason, log)
	case stepAsk:
		r.ask(ctx, key, run.Attempt, log)
		return now // see what it came to at once
	}
	return now.Add(r.interval(rec, now))
}

// ask claims the call for the run's completed attempt and, with the claim, asks GitHub for
// the rerun, within half of the claim.
func (r *Reruns) ask(ctx context.Context, key string, attempt int, log zerolog.Logger) {
	now := r.cfg.Now()
	rec, err := r.apply(ctx, key, rerunEvent{kind: rerunClaim, actor: r.cfg.Actor, at: now, attempt: attempt, hold: r.cfg.Hold})
	if err != nil {
		// Another replica claimed it, or moved the record on: the next pass reads it again.
		log.Debug().Err(err).Msg("github: claim a rerun")
		return
	}
	cctx, cancel := context.WithDeadline(ctx, now.Add(r.cfg.Hold/2))
	err = r.cfg.Clients.RerunFailedJobs(cctx, rec.Repo, rec.Run)
	cancel()
	if err != nil {
		r.cfg.Metrics.RerunErrors.WithLabelValues("rerun").Inc()
		log.Warn().Err(err).Int("attempt", attempt).Msg("github: rerun-failed-jobs failed; tried again after a pause")
		var apiErr *APIError
		rec, aerr := r.apply(ctx, key, rerunEvent{kind: rerunFail, actor: r.cfg.Actor, at: r.cfg.Now(), err: err.Error(),
			unsure: !errors.As(err, &apiErr), maxTries: rerunMaxTries})
		if aerr == nil && rec.State == RerunSkipped {
			r.cfg.Metrics.Reruns.WithLabelValues(rec.Outcome).Inc()
			log.Error().Str("outcome", rec.Outcome).Str("reason", rec.Reason).Msg("github: gave up rerunning the jobs of a workflow run whose environment was lost")
		}
		return
	}
	r.asked(ctx, key, rerunEvent{kind: rerunAsked, actor: r.cfg.Actor, at: r.cfg.Now()},
		fmt.Sprintf("GitHub accepted rerun-failed-jobs for attempt %d", attempt), log)
}

// asked records the rerun asked.
func (r *Reruns) asked(ctx context.Context, key string, ev rerunEvent, what string, log zerolog.Logger) {
	rec, err := r.apply(ctx, key, ev)
	if err != nil {
		// The call went through: the next pass sees the run's attempt grown and records it.
		log.Warn().Err(err).Msg("github: record a rerun asked; the next pass records it")
		return
	}
	r.cfg.Metrics.Reruns.WithLabelValues(OutcomeRerun).Inc()
	log.Info().Str("outcome", OutcomeRerun).Int("attempt", rec.Attempt).Int("reruns", rec.Reruns).Ints64("slots", taskIDs(rec.Slots)).
		Msg("github: the failed jobs of a workflow run whose environment was lost run again: " + what)
}

// skip ends the round without a rerun.
func (r *Reruns) skip(ctx context.Context, key, outcome, reason string, log zerolog.Logger) {
	rec, err := r.apply(ctx, key, rerunEvent{kind: rerunSkip, actor: r.cfg.Actor, at: r.cfg.Now(), outcome: outcome, reason: reason})
	if err != nil {
		log.Debug().Err(err).Msg("github: record a rerun skipped")
		return
	}
	r.cfg.Metrics.Reruns.WithLabelValues(outcome).Inc()
	level := zerolog.InfoLevel
	if outcome == OutcomeRefused || outcome == OutcomeGone || outcome == OutcomeGaveUp {
		level = zerolog.WarnLevel
	}
	log.WithLevel(level).Str("outcome", outcome).Str("reason", reason).Int("attempt", rec.Attempt).Ints64("slots", taskIDs(rec.Slots)).
		Msg("github: the jobs of a workflow run whose environment was lost are not run again")
}

// backed reports whether a slot the record names has an authentic record of a lost
// environment in its run and repository: the record is believed only then.
func (r *Reruns) backed(ctx context.Context, rec Rerun) (bool, error) {
	for _, task := range rec.Slots {
		st, err := r.cfg.Events.Get(ctx, task)
		if errors.Is(err, assignment.ErrNotFound) {
			continue
		}
		if err != nil {
			return false, err
		}
		if st.GitHub() && st.Lost && st.GitHubJob != "" && st.RunID == rec.Run && strings.EqualFold(st.Repo, rec.Repo) {
			return true, nil
		}
	}
	return false, nil
}

// interval is how long a round waits before its run is read again: Poll, growing with the
// round's age to ten times Poll.
func (r *Reruns) interval(rec Rerun, now time.Time) time.Duration {
	return min(max(now.Sub(rec.Since)/10, r.cfg.Poll), 10*r.cfg.Poll)
}

// backoff is the pause after the n-th failure: Poll doubling, to ten times Poll.
func (r *Reruns) backoff(n int) time.Duration {
	d := r.cfg.Poll
	for i := 1; i < n && d < 10*r.cfg.Poll; i++ {
		d *= 2
	}
	return min(d, 10*r.cfg.Poll)
}

// get reads a run's record and its revision.
func (r *Reruns) get(ctx context.Context, key string) (Rerun, uint64, error) {
	e, err := r.cfg.KV.Get(ctx, key)
	if err != nil {
		return Rerun{}, 0, err
	}
	var rec Rerun
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return Rerun{}, 0, fmt.Errorf("github: rerun record %s: %w", key, err)
	}
	return rec, e.Revision(), nil
}

// apply reads the run's record, decides ev on it and writes the result by compare-and-swap
// (a create for the first): a conflicting write fails (conflict) and writes nothing.
func (r *Reruns) apply(ctx context.Context, key string, ev rerunEvent) (Rerun, error) {
	cur, rev, err := r.get(ctx, key)
	var curp *Rerun
	switch {
	case err == nil:
		curp = &cur
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return Rerun{}, err
	}
	next, err := decideRerun(curp, ev)
	if err != nil {
		return Rerun{}, err
	}
	data, err := json.Marshal(next)
	if err != nil {
		return Rerun{}, err
	}
	if curp == nil {
		_, err = r.cfg.KV.Create(ctx, key, data)
	} else {
		_, err = r.cfg.KV.Update(ctx, key, data, rev)
	}
	if err != nil {
		return Rerun{}, err
	}
	return next, nil
}

// conflict reports a write of apply that lost a compare-and-swap race.
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

func taskIDs(ts []assignment.TaskID) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = int64(t)
	}
	return out
}
