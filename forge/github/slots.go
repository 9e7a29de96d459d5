package github

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/actions/scaleset"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
)

// SlotLog is what Slots uses of the event log. *eventlog.Log is one.
type SlotLog interface {
	Apply(ctx context.Context, ev assignment.Event, hint *assignment.State) (assignment.State, error)
	Get(ctx context.Context, task assignment.TaskID) (assignment.State, error)
	PutTask(ctx context.Context, task assignment.TaskID, sealed []byte) error
	GetTask(ctx context.Context, task assignment.TaskID) ([]byte, error)
	DropTask(ctx context.Context, task assignment.TaskID) error
	Dispatch(ctx context.Context, backend assignment.Backend, task assignment.TaskID, epoch assignment.Epoch) error
}

// SlotView is what Slots reads of the live assignments. *eventlog.View is one.
type SlotView interface {
	Live() []assignment.State
}

// DefaultSlotLease is a slot's lease: a slot is not renewed (its runner talks to GitHub, not
// to dynrunner), so its lease is the longest job it may run: GitHub's default job timeout,
// six hours.
const DefaultSlotLease = 6 * time.Hour

// reportHold is how long a claim on a failed slot's report (its runner's removal) holds.
const reportHold = time.Minute

// SlotsConfig configures Slots.
type SlotsConfig struct {
	Events SlotLog
	View   SlotView
	// Box seals the JIT configurations (TASK_KEY's box, as for Gitea tasks).
	Box   *sealbox.Box
	Actor string
	// Capacity is a tier's capacity (POD_CONCURRENCY, VM_CONCURRENCY): its Gitea assignments
	// in flight and its GitHub slots together stay within it.
	Capacity func(assignment.Backend) int
	// Pickup is how long a slot's runner may wait for GitHub to give it a job; Lease the
	// longest job (DefaultSlotLease if zero).
	Pickup, Lease time.Duration
	// Reruns, when set, notes each slot that lost its environment after its runner took a job
	// before the slot is closed, so its job runs again once its workflow run completes.
	Reruns *Reruns
	// Metrics counts the jobs refused (Metrics.JobsRefused); none when nil.
	Metrics *Metrics
	Log     zerolog.Logger
	// Now is the clock; time.Now if nil.
	Now func() time.Time
}

// Slots is the Handler of a scale set's session. It keeps one environment slot per job GitHub
// assigned to the scale set (Plan), and persists each slot in JetStream before it calls
// GitHub: the claim (the intent, with the runner's name), then the JIT configuration sealed
// in the tasks bucket and `configured` with the runner's id, then the dispatch. A holder that
// dies between two steps leaves a record the next holder finishes from (Reconcile): a claimed
// slot without a runner is configured (a runner of its name that GitHub already has is
// removed first, as its configuration was lost), a failed slot's runner is removed by id.
// JobStarted and JobCompleted messages are recorded on the slot whose runner they name.
//
// A job whose runs-on labels are not its scale set's (Fits) is refused: it is not acquired,
// and while GitHub counts it among the scale set's assigned jobs no slot is made for it. The
// jobs refused are remembered in memory, per scale set, until their JobCompleted: a new
// holder of the session does not know them.
type Slots struct {
	cfg SlotsConfig

	mu      sync.Mutex
	refused map[refusedJob]bool // → GitHub assigned it to the scale set (its statistics count it)
	order   []refusedJob        // oldest first, to forget the oldest beyond maxRefused
}

// refusedJob is a job refused by a scale set: its runner request id there.
type refusedJob struct {
	set     int
	request int64
}

// maxRefused bounds the refused jobs remembered; the oldest are forgotten beyond it.
const maxRefused = 4096

// NewSlots returns the Handler.
func NewSlots(cfg SlotsConfig) *Slots {
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultSlotLease
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return &Slots{cfg: cfg, refused: map[refusedJob]bool{}}
}

var _ Handler = (*Slots)(nil)

// Handle records the message's job starts and completions, acquires its available jobs and
// creates or retires slots as Plan says, then reconciles. Jobs whose labels are not the scale
// set's are refused (refuse); a message without statistics makes and retires no slot.
func (h *Slots) Handle(ctx context.Context, s *Session, msg *scaleset.RunnerScaleSetMessage) error {
	set := s.Set()
	for _, m := range msg.JobStartedMessages {
		if err := h.jobStarted(ctx, set, m.RunnerID, m.RunnerName, m.JobMessageBase); err != nil {
			return err
		}
	}
	for _, m := range msg.JobCompletedMessages {
		if h.forget(set, m.RunnerRequestID) {
			continue // a job refused: no slot of this scale set ran it
		}
		if err := h.jobCompleted(ctx, s, m); err != nil {
			return err
		}
	}
	var available []int64
	for _, m := range msg.JobAvailableMessages {
		if !h.refuse(set, m.JobMessageBase, false) {
			available = append(available, m.RunnerRequestID)
		}
	}
	for _, m := range msg.JobAssignedMessages {
		h.refuse(set, m.JobMessageBase, true)
	}
	steps := Steps{Acquire: available}
	if msg.Statistics == nil {
		h.cfg.Log.Warn().Int("message", msg.MessageID).Int("scale_set", set.ID).
			Msg("github: a message without statistics: no slot is made or retired for it (the next message's statistics say how many jobs are assigned)")
	} else {
		assigned := max(msg.Statistics.TotalAssignedJobs-h.refusedAssigned(set), 0)
		steps = Plan(Snapshot{Assigned: assigned, Available: available, Slots: h.planSlots(set), Capacity: h.capacity(set)})
	}
	if len(steps.Acquire) > 0 {
		if _, err := s.Client().AcquireJobs(ctx, steps.Acquire); err != nil {
			return fmt.Errorf("github: acquire jobs %v: %w", steps.Acquire, err)
		}
	}
	for range steps.Create {
		if err := h.create(ctx, s); err != nil {
			return err
		}
	}
	for _, id := range steps.Retire {
		h.retire(ctx, s, id, "no job assigned to the scale set needs the slot any more (GitHub cancelled or gave the job to another runner)")
	}
	return h.Reconcile(ctx, s)
}

// refuse reports whether job, of a JobAvailable or (assigned) a JobAssigned message, is to be
// refused because its labels are not set's. A job refused the first time is logged and counted;
// one GitHub assigned to the scale set anyway is remembered as such, so that the statistics'
// count of it makes no slot.
func (h *Slots) refuse(set ScaleSet, job scaleset.JobMessageBase, assigned bool) bool {
	if Fits(job.RequestLabels, set) {
		return false
	}
	key := refusedJob{set: set.ID, request: job.RunnerRequestID}
	h.mu.Lock()
	defer h.mu.Unlock()
	was, known := h.refused[key]
	if !known {
		h.cfg.Metrics.JobsRefused.WithLabelValues(scaleSetLabel(set.ID)).Inc()
		h.cfg.Log.Warn().Int("scale_set", set.ID).Str("scale_set_name", set.Name).Int64("runner_request", job.RunnerRequestID).
			Str("job", job.JobID).Strs("labels", job.RequestLabels).Str("repo", job.OwnerName+"/"+job.RepositoryName).
			Str("workflow", job.JobWorkflowRef).
			Msgf("github: refusing a job whose runs-on labels are not the scale set's (%s, %s or %s): not acquired, no slot made; check the workflow's runs-on, and the scale set's labels in GitHub", LabelSelfHosted, set.Tier, set.Name)
		if len(h.order) >= maxRefused {
			delete(h.refused, h.order[0])
			h.order = h.order[1:]
		}
		h.order = append(h.order, key)
	}
	h.refused[key] = was || assigned
	return true
}

// forget forgets a refused job that completed; false when set did not refuse it.
func (h *Slots) forget(set ScaleSet, request int64) bool {
	key := refusedJob{set: set.ID, request: request}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.refused[key]; !ok {
		return false
	}
	delete(h.refused, key)
	h.order = slices.DeleteFunc(h.order, func(k refusedJob) bool { return k == key })
	return true
}

// refusedAssigned is how many jobs set refused that GitHub assigned to it: its statistics
// count them among the assigned jobs.
func (h *Slots) refusedAssigned(set ScaleSet) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for k, assigned := range h.refused {
		if k.set == set.ID && assigned {
			n++
		}
	}
	return n
}

// Reconcile finishes what an earlier holder left half done: it configures claimed slots
// without a runner and removes the runners of failed slots. A failed slot whose environment
// was lost after its runner took a job is noted for a rerun (Reruns.Note) before it is closed:
// once closed, it is no live slot any more.
func (h *Slots) Reconcile(ctx context.Context, s *Session) error {
	var errs []error
	now := h.cfg.Now()
	for _, st := range h.live(s.Set()) {
		switch {
		case idleDue(st, now):
			h.retire(ctx, s, int64(st.Task), fmt.Sprintf("GitHub gave the slot's runner no job within %s of its creation (retired ahead of GITHUB_IDLE_SECS, %s); its runner was removed, and a job still waiting gets another slot",
				now.Sub(st.ClaimedAt).Round(time.Second), st.PickupDeadline.Sub(st.ClaimedAt).Round(time.Second)))
		case st.Phase == assignment.Claimed && !st.Ready():
			// The view may be behind the log: configure what the log holds.
			if cur, err := h.cfg.Events.Get(ctx, st.Task); err != nil {
				errs = append(errs, err)
			} else if cur.Phase == assignment.Claimed && !cur.Ready() {
				errs = append(errs, h.configure(ctx, s, cur))
			}
		case st.Phase == assignment.Failed:
			if h.cfg.Reruns != nil && Wanted(st) {
				if err := h.cfg.Reruns.Note(ctx, st); err != nil {
					errs = append(errs, err)
					continue // closed once noted
				}
			}
			errs = append(errs, h.close(ctx, s, st))
		}
	}
	return errors.Join(errs...)
}

// idleDue reports whether a slot's runner got no job and its idle deadline (GITHUB_IDLE_SECS,
// the slot's pickup deadline) is near: Reconcile then retires it as Plan retires a slot no job
// needs, its runner removed at GitHub first, so a runner that takes a job in that moment keeps
// its slot. It retires idleAhead ahead: a minute, more than the longest gap between two
// reconciles (one follows each long poll, which GitHub holds for up to 50 s), so it comes
// before the deadline, which the scheduler's reconciler enforces without asking GitHub; at
// most half the idle time (GITHUB_IDLE_SECS below 2 min), so a slot gets at least that long.
func idleDue(st assignment.State, now time.Time) bool {
	if !st.Active() || st.Phase == assignment.Running || st.GitHubJob != "" || st.PickupDeadline.IsZero() {
		return false
	}
	ahead := min(st.PickupDeadline.Sub(st.ClaimedAt)/2, idleAhead)
	return !now.Before(st.PickupDeadline.Add(-ahead))
}

// idleAhead is how long before its idle deadline Reconcile retires a slot.
const idleAhead = time.Minute

// live are the live slots of set's scale set.
func (h *Slots) live(set ScaleSet) []assignment.State {
	var out []assignment.State
	for _, st := range h.cfg.View.Live() {
		if st.GitHub() && st.ScaleSet == set.ID {
			out = append(out, st)
		}
	}
	return out
}

// planSlots are the active slots of set's scale set, as Plan sees them.
func (h *Slots) planSlots(set ScaleSet) []Slot {
	var out []Slot
	for _, st := range h.live(set) {
		if st.Active() {
			out = append(out, Slot{ID: int64(st.Task), Bound: st.GitHubJob != "", Since: st.ClaimedAt})
		}
	}
	return out
}

// capacity is how many active slots set's scale set may have: its tier's capacity less the
// Gitea assignments of the tier in flight.
func (h *Slots) capacity(set ScaleSet) int {
	n := h.cfg.Capacity(set.Tier)
	for _, st := range h.cfg.View.Live() {
		if !st.GitHub() && st.Backend == set.Tier && st.InFlight() {
			n--
		}
	}
	return max(n, 0)
}

// create claims a new slot, then configures it.
func (h *Slots) create(ctx context.Context, s *Session) error {
	set := s.Set()
	id := assignment.SlotBase + assignment.TaskID(h.cfg.Now().UnixMicro())
	var st assignment.State
	var err error
	for range 3 { // a slot id taken at the same microsecond: the next one
		st, err = h.cfg.Events.Apply(ctx, assignment.Event{
			Transition: assignment.Claimed, Task: id, Backend: set.Tier, Actor: h.cfg.Actor, At: h.cfg.Now(),
			Forge: assignment.ForgeGitHub, ScaleSet: set.ID, RunnerName: fmt.Sprintf("%s-%d", set.Name, id-assignment.SlotBase),
			RunsOn: []string{LabelSelfHosted, string(set.Tier)}, Lease: h.cfg.Lease, Pickup: h.cfg.Pickup,
		}, nil)
		if !errors.Is(err, assignment.ErrExists) {
			break
		}
		id++
	}
	if err != nil {
		return fmt.Errorf("github: claim a slot of scale set %s: %w", set.Name, err)
	}
	return h.configure(ctx, s, st)
}

// configure gives a claimed slot its JIT runner: it generates the configuration, seals and
// stores it, records the runner's id with `configured`, and dispatches the slot. A sealed
// configuration already stored whose runner GitHub still has is the one a holder that died
// before `configured` made: it is taken as it is.
func (h *Slots) configure(ctx context.Context, s *Session, st assignment.State) error {
	client := s.Clients().Client()
	runnerID, digest, err := h.stored(ctx, client, st)
	if err != nil {
		return err
	}
	if runnerID == 0 {
		if runnerID, digest, err = h.generate(ctx, client, s.Set(), st); err != nil {
			return err
		}
	}
	st, err = h.cfg.Events.Apply(ctx, assignment.Event{Transition: assignment.Configured, Task: st.Task, Epoch: st.Epoch(),
		Actor: h.cfg.Actor, At: h.cfg.Now(), RunnerID: runnerID, TaskDigest: digest}, &st)
	if err != nil && !errors.Is(err, assignment.ErrNoChange) {
		return fmt.Errorf("github: record slot %d's runner %d: %w", st.Task, runnerID, err)
	}
	if st.Phase != assignment.Claimed {
		return nil // dispatched already: it went on while this holder's view was behind
	}
	if err := h.cfg.Events.Dispatch(ctx, st.Backend, st.Task, st.Epoch()); err != nil {
		return fmt.Errorf("github: dispatch slot %d: %w (the scheduler dispatches it again)", st.Task, err)
	}
	return nil
}

// stored returns the runner id and digest of a slot's configuration stored by an earlier
// holder whose runner GitHub still has; zero when there is none to take. A stored one whose
// runner is gone is dropped.
func (h *Slots) stored(ctx context.Context, client *scaleset.Client, st assignment.State) (int64, string, error) {
	sealed, err := h.cfg.Events.GetTask(ctx, st.Task)
	if errors.Is(err, assignment.ErrNotFound) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", err
	}
	runner, err := client.GetRunnerByName(ctx, st.RunnerName)
	if err != nil {
		return 0, "", fmt.Errorf("github: look up runner %s of slot %d: %w", st.RunnerName, st.Task, err)
	}
	if runner != nil {
		return int64(runner.ID), sealedtask.Digest(sealed), nil
	}
	return 0, "", h.cfg.Events.DropTask(ctx, st.Task)
}

// generate makes the slot's JIT runner and stores its sealed configuration. A runner of the
// slot's name that exists already was made by a holder that died before storing its
// configuration, which is lost: it is removed and made again.
func (h *Slots) generate(ctx context.Context, client *scaleset.Client, set ScaleSet, st assignment.State) (int64, string, error) {
	setting := &scaleset.RunnerScaleSetJitRunnerSetting{Name: st.RunnerName, WorkFolder: "_work"}
	jit, err := client.GenerateJitRunnerConfig(ctx, setting, set.ID)
	if errors.Is(err, scaleset.RunnerExistsError) {
		runner, gerr := client.GetRunnerByName(ctx, st.RunnerName)
		if gerr != nil || runner == nil {
			return 0, "", fmt.Errorf("github: runner %s of slot %d exists but cannot be read: %w", st.RunnerName, st.Task, errors.Join(err, gerr))
		}
		if err := client.RemoveRunner(ctx, int64(runner.ID)); err != nil && !errors.Is(err, scaleset.RunnerNotFoundError) {
			return 0, "", fmt.Errorf("github: remove runner %d left by an earlier holder: %w", runner.ID, err)
		}
		jit, err = client.GenerateJitRunnerConfig(ctx, setting, set.ID)
	}
	if err != nil {
		return 0, "", fmt.Errorf("github: generate the JIT configuration of slot %d: %w", st.Task, err)
	}
	sealed, digest, err := sealedtask.SealJIT(h.cfg.Box, st.Task, jit.EncodedJITConfig)
	if err != nil {
		return 0, "", err
	}
	if err := h.cfg.Events.PutTask(ctx, st.Task, sealed); err != nil {
		return 0, "", fmt.Errorf("github: store the JIT configuration of slot %d: %w", st.Task, err)
	}
	return int64(jit.Runner.ID), digest, nil
}

// retire fails an idle slot no assigned job needs (or whose idle deadline is near), for
// reason, after removing its runner from GitHub.
// GitHub refuses to remove a runner that is running a job, so a slot whose runner took a job
// the messages have not told of yet (JobStarted comes in a later message than the statistics
// that no longer count the slot) is kept; its JobStarted binds it.
func (h *Slots) retire(ctx context.Context, s *Session, id int64, reason string) {
	st, err := h.cfg.Events.Get(ctx, assignment.TaskID(id))
	if err != nil || st.GitHubJob != "" || !st.Active() {
		return // its runner took a job meanwhile (Plan saw a view behind the log), or it ended
	}
	if err := h.removeRunner(ctx, s.Clients().Client(), st); err != nil {
		if errors.Is(err, scaleset.JobStillRunningError) {
			h.cfg.Log.Debug().Int64("slot", id).Msg("github: slot not retired: its runner is running a job")
			return
		}
		h.cfg.Log.Warn().Err(err).Int64("slot", id).Msg("github: slot not retired: its runner could not be removed; the next message's plan tries again, and GITHUB_IDLE_SECS ends the slot at the latest")
		return
	}
	_, err = h.cfg.Events.Apply(ctx, assignment.Event{Transition: assignment.Failed, Task: st.Task, Epoch: st.Epoch(),
		Actor: h.cfg.Actor, At: h.cfg.Now(), Reason: reason}, &st)
	if err != nil && !errors.Is(err, assignment.ErrNoChange) {
		h.cfg.Log.Debug().Err(err).Int64("slot", id).Msg("github: retire a slot")
	}
}

// close reports a failed slot to GitHub, which is removing its runner by id, then records
// `closed`. A runner that is running a job is not removed (GitHub refuses): it is tried again
// once the report claim runs out.
func (h *Slots) close(ctx context.Context, s *Session, st assignment.State) error {
	st, err := h.cfg.Events.Apply(ctx, assignment.Event{Transition: assignment.Reporting, Task: st.Task, Epoch: st.Epoch(),
		Actor: h.cfg.Actor, At: h.cfg.Now(), Lease: reportHold}, &st)
	if errors.Is(err, assignment.ErrReportClaimed) || errors.Is(err, assignment.ErrTerminal) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("github: claim slot %d's report: %w", st.Task, err)
	}
	if err := h.removeRunner(ctx, s.Clients().Client(), st); err != nil {
		return err
	}
	_, err = h.cfg.Events.Apply(ctx, assignment.Event{Transition: assignment.Closed, Task: st.Task, Epoch: st.Epoch(),
		Actor: h.cfg.Actor, At: h.cfg.Now()}, &st)
	if err != nil && !errors.Is(err, assignment.ErrTerminal) {
		return fmt.Errorf("github: close slot %d: %w", st.Task, err)
	}
	return nil
}

// removeRunner removes a slot's runner by id, or by name if its id was never recorded; one
// that is gone already is fine.
func (h *Slots) removeRunner(ctx context.Context, client *scaleset.Client, st assignment.State) error {
	id := st.RunnerID
	if id == 0 {
		runner, err := client.GetRunnerByName(ctx, st.RunnerName)
		if err != nil {
			return fmt.Errorf("github: look up runner %s of slot %d: %w", st.RunnerName, st.Task, err)
		}
		if runner == nil {
			return nil
		}
		id = int64(runner.ID)
	}
	err := client.RemoveRunner(ctx, id)
	if err != nil && !errors.Is(err, scaleset.RunnerNotFoundError) {
		return fmt.Errorf("github: remove runner %d of slot %d: %w", id, st.Task, err)
	}
	return nil
}

// slotOf finds the live slot of set's scale set whose runner has id or name. A message that
// names the runner of one slot by id and of another (or none) by name names no slot.
func (h *Slots) slotOf(set ScaleSet, runnerID int, name string) (assignment.State, bool) {
	for _, st := range h.live(set) {
		if (runnerID != 0 && st.RunnerID == int64(runnerID)) || (name != "" && st.RunnerName == name) {
			if (name != "" && st.RunnerName != name) || (runnerID != 0 && st.RunnerID != 0 && st.RunnerID != int64(runnerID)) {
				h.cfg.Log.Warn().Int("runner_id", runnerID).Str("runner", name).Uint64("slot", uint64(st.Task)).
					Msg("github: a job message names a runner by an id and a name that are not one slot's runner; ignored")
				return assignment.State{}, false
			}
			return st, true
		}
	}
	return assignment.State{}, false
}

// jobStarted records the job GitHub gave a slot's runner. A runner that is no live slot's
// (another controller's, or a slot that ended) is logged and left alone.
func (h *Slots) jobStarted(ctx context.Context, set ScaleSet, runnerID int, name string, job scaleset.JobMessageBase) error {
	st, ok := h.slotOf(set, runnerID, name)
	if !ok {
		h.cfg.Log.Warn().Int("runner_id", runnerID).Str("runner", name).Str("job", job.JobID).
			Msg("github: JobStarted for a runner that is no live slot of this scale set; ignored")
		return nil
	}
	_, err := h.cfg.Events.Apply(ctx, assignment.Event{Transition: assignment.Running, Task: st.Task, Epoch: st.Epoch(),
		Actor: h.cfg.Actor, At: h.cfg.Now(), RunnerID: int64(runnerID), GitHubJob: job.JobID, RunID: job.WorkflowRunID,
		Repo: job.OwnerName + "/" + job.RepositoryName, Job: job.JobDisplayName}, &st)
	return h.recorded(err, st, "JobStarted")
}

// jobCompleted records a slot's job's result, then removes its runner (GitHub removes a JIT
// runner after its job; this makes sure).
func (h *Slots) jobCompleted(ctx context.Context, s *Session, m *scaleset.JobCompleted) error {
	st, ok := h.slotOf(s.Set(), m.RunnerID, m.RunnerName)
	if !ok {
		h.cfg.Log.Warn().Int("runner_id", m.RunnerID).Str("runner", m.RunnerName).Str("job", m.JobID).
			Msg("github: JobCompleted for a runner that is no live slot of this scale set; ignored")
		return nil
	}
	if st.GitHubJob == "" { // its JobStarted was not recorded (it came in this same message, or never)
		if err := h.jobStarted(ctx, s.Set(), m.RunnerID, m.RunnerName, m.JobMessageBase); err != nil {
			return err
		}
		var ok bool
		if st, ok = h.slotOf(s.Set(), m.RunnerID, m.RunnerName); !ok {
			return nil
		}
		if got, err := h.cfg.Events.Get(ctx, st.Task); err == nil {
			st = got
		}
	}
	if st.GitHubJob != m.JobID {
		h.cfg.Log.Warn().Int("runner_id", m.RunnerID).Str("runner", m.RunnerName).Str("job", m.JobID).
			Uint64("slot", uint64(st.Task)).Str("slot_job", st.GitHubJob).
			Msg("github: JobCompleted for a job that is not the one the slot's runner took; ignored")
		return nil
	}
	result := m.Result
	if result == "" {
		result = "unknown"
	}
	_, err := h.cfg.Events.Apply(ctx, assignment.Event{Transition: assignment.Completed, Task: st.Task, Epoch: st.Epoch(),
		Actor: h.cfg.Actor, At: h.cfg.Now(), Result: result}, &st)
	if err := h.recorded(err, st, "JobCompleted"); err != nil {
		return err
	}
	if err := h.removeRunner(ctx, s.Clients().Client(), st); err != nil {
		h.cfg.Log.Debug().Err(err).Msg("github: remove a completed slot's runner")
	}
	return nil
}

// recorded sorts an append's error: done or refused by the slot's state (logged: the message
// changes nothing), or an error to handle the message again for.
func (h *Slots) recorded(err error, st assignment.State, what string) error {
	switch {
	case err == nil, errors.Is(err, assignment.ErrNoChange):
		return nil
	case errors.Is(err, assignment.ErrInvalidTransition), errors.Is(err, assignment.ErrTerminal),
		errors.Is(err, assignment.ErrAlreadyFetched), errors.Is(err, assignment.ErrStaleEpoch):
		h.cfg.Log.Warn().Err(err).Uint64("slot", uint64(st.Task)).Msg("github: " + what + " does not apply to the slot; ignored")
		return nil
	}
	return fmt.Errorf("github: record %s on slot %d: %w", what, st.Task, err)
}
