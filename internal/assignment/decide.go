package assignment

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Errors returned by Decide. Callers branch on them with errors.Is.
var (
	// ErrExists: a claim for a task that already has an assignment.
	ErrExists = errors.New("assignment already exists")
	// ErrNotFound: an event for a task that has no assignment.
	ErrNotFound = errors.New("no such assignment")
	// ErrStaleEpoch: the event carries an epoch other than the assignment's current one.
	ErrStaleEpoch = errors.New("stale epoch")
	// ErrTerminal: the assignment already ended.
	ErrTerminal = errors.New("assignment already ended")
	// ErrInvalidTransition: the event does not apply to the assignment's phase.
	ErrInvalidTransition = errors.New("invalid transition")
	// ErrTokenRedeemed: the capability token was already redeemed.
	ErrTokenRedeemed = errors.New("capability token already redeemed")
	// ErrTokenMismatch: the capability token is not the one issued to the current environment.
	ErrTokenMismatch = errors.New("capability token not issued for this environment")
	// ErrAlreadyFetched: the task was already handed to a runner.
	ErrAlreadyFetched = errors.New("task already handed over")
	// ErrNoChange: the event is already in effect (an idempotent retry); nothing to append.
	ErrNoChange = errors.New("no change")
	// ErrReportClaimed: another scheduler claimed the failure report, and its claim holds.
	ErrReportClaimed = errors.New("failure report claimed by another scheduler")
	// ErrNotDue: a deadline's failure (Event.Deadline) for an assignment that, as it stands, has
	// met its deadlines (its lease was renewed, its task fetched): the failure was decided on a
	// stale state. Nothing to append.
	ErrNotDue = errors.New("no deadline passed")
)

// Event asks for one transition. Epoch is the epoch the sender holds (zero for a claim).
type Event struct {
	Transition Transition
	Task       TaskID
	Epoch      Epoch
	Actor      string
	At         time.Time

	// Claim only.
	Backend    Backend
	Repo       string
	Job        string
	RunsOn     []string
	Fork       bool
	ForgeURL   ForgeURL
	TaskDigest string
	// Claim and Admitted: how long the environment's runner has to fetch the task, from At.
	Pickup time.Duration
	// Claim, Admitted and Renewed: the lease length from At. Reporting: how long the report
	// claim holds.
	Lease time.Duration
	// Claim: with Queue set the claim waits for capacity in phase queued, and fails if it is not
	// admitted within Queue (QUEUE_SECS).
	Queue time.Duration

	// Started: the environment's handle and the id of the token issued to it.
	// Registered: the id of the token redeemed.
	Handle  json.RawMessage
	TokenID string
	// Registered and Running.
	RunnerUUID string
	// GitHub slots. Claim: Forge, ScaleSet and RunnerName. Configured: RunnerID and
	// TaskDigest. Running: RunnerID (the runner JobStarted named), GitHubJob, RunID, Repo and
	// Job.
	Forge      Forge
	ScaleSet   int
	RunnerName string
	RunnerID   int64
	GitHubJob  string
	RunID      int64
	// Completed.
	Result string
	// Failed.
	Reason string
	// Failed: the environment was lost (Record.Lost).
	Lost bool
	// Failed: the failure is a deadline that passed at At (Overdue). Decide checks it again
	// against the state it is given, so a failure decided on a stale state (a view behind a
	// renewal or the fetch, e.g. while NATS fails over) is not appended once the compare-and-swap
	// makes the appender read the assignment again: ErrNotDue then.
	Deadline bool
}

// Decide computes the record that applying ev to cur appends. cur is nil when the task has no
// assignment yet. It is a pure function: no I/O, no clock.
func Decide(cur *State, ev Event) (Record, error) {
	if ev.Transition == Claimed {
		return decideClaim(cur, ev)
	}
	if cur == nil {
		return Record{}, fmt.Errorf("assignment: %s: %w", ev.Transition, ErrNotFound)
	}
	if ev.Epoch != cur.Epoch() {
		return Record{}, fmt.Errorf("assignment: task %d: %s with epoch %d, current epoch is %d: %w",
			cur.Task, ev.Transition, ev.Epoch, cur.Epoch(), ErrStaleEpoch)
	}
	if Terminal(cur.Phase) {
		if ev.Transition == cur.Phase {
			return Record{}, ErrNoChange
		}
		return Record{}, fmt.Errorf("assignment: task %d: %s after %s: %w", cur.Task, ev.Transition, cur.Phase, ErrTerminal)
	}
	next := cur.Record
	next.Transition = ev.Transition
	next.Phase = ev.Transition
	next.Epoch = cur.Epoch()
	next.Actor = ev.Actor
	next.At = ev.At
	next.Reason = ""
	next.Reporter, next.ReportUntil = "", time.Time{}

	bad := func() (Record, error) {
		return Record{}, fmt.Errorf("assignment: task %d: %s in phase %s: %w", cur.Task, ev.Transition, cur.Phase, ErrInvalidTransition)
	}
	switch ev.Transition {
	case Admitted:
		switch cur.Phase {
		case Queued:
		case Claimed, Dispatched, Started, Registered, Running:
			if !cur.AdmittedAt.IsZero() {
				return Record{}, ErrNoChange
			}
			return bad()
		default:
			return bad()
		}
		if ev.Lease <= 0 || ev.Pickup <= 0 || ev.Pickup >= ev.Lease {
			return Record{}, fmt.Errorf("assignment: task %d: admitted with lease %s and pickup %s: pickup must be positive and below the lease: %w",
				cur.Task, ev.Lease, ev.Pickup, ErrInvalidTransition)
		}
		next.Phase = Claimed
		next.AdmittedAt = ev.At
		next.PickupDeadline = ev.At.Add(ev.Pickup)
		next.LeaseExpires = ev.At.Add(ev.Lease)
	case Configured:
		if !cur.GitHub() {
			return bad()
		}
		switch {
		case cur.Phase != Claimed && !Terminal(cur.Phase) && cur.Phase != Failed &&
			cur.RunnerID == ev.RunnerID && cur.TaskDigest == ev.TaskDigest:
			// A holder that read the slot before it went on (a view behind the log).
			return Record{}, ErrNoChange
		case cur.Phase != Claimed:
			return bad()
		case ev.RunnerID <= 0 || ev.TaskDigest == "":
			return Record{}, fmt.Errorf("assignment: slot %d: configured without a runner id or a sealed configuration: %w", cur.Task, ErrInvalidTransition)
		case cur.RunnerID == ev.RunnerID && cur.TaskDigest == ev.TaskDigest:
			return Record{}, ErrNoChange
		case cur.RunnerID != 0:
			return Record{}, fmt.Errorf("assignment: slot %d: configured for runner %d, already runner %d's: %w", cur.Task, ev.RunnerID, cur.RunnerID, ErrInvalidTransition)
		}
		next.Phase = Claimed
		next.RunnerID = ev.RunnerID
		next.TaskDigest = ev.TaskDigest
	case Dispatched:
		switch cur.Phase {
		case Claimed:
			if !cur.Ready() {
				return Record{}, fmt.Errorf("assignment: slot %d: dispatched before its runner was configured: %w", cur.Task, ErrInvalidTransition)
			}
		case Dispatched, Started, Registered, Running:
			return Record{}, ErrNoChange
		default:
			return bad()
		}
	case Started:
		switch cur.Phase {
		case Claimed, Dispatched:
			if !cur.Ready() {
				return Record{}, fmt.Errorf("assignment: slot %d: started before its runner was configured: %w", cur.Task, ErrInvalidTransition)
			}
		case Started:
			if string(cur.Handle) == string(ev.Handle) && cur.TokenID == ev.TokenID {
				return Record{}, ErrNoChange
			}
			return bad()
		case Running:
			// A slot's runner may take its job, and the JobStarted message be recorded,
			// before the worker records the environment's start: the start is recorded
			// and the phase stays running.
			if !cur.GitHub() || len(cur.Handle) != 0 {
				if cur.GitHub() && string(cur.Handle) == string(ev.Handle) {
					return Record{}, ErrNoChange
				}
				return bad()
			}
			next.Phase = Running
		default:
			return bad()
		}
		// A GitHub slot's environment gets no capability token: its JIT configuration is its
		// only credential.
		if len(ev.Handle) == 0 || (ev.TokenID == "" && !cur.GitHub()) {
			return Record{}, fmt.Errorf("assignment: task %d: started without handle or token id: %w", cur.Task, ErrInvalidTransition)
		}
		next.Handle = ev.Handle
		next.TokenID = ev.TokenID
		next.StartedBy = ev.Actor
	case Registered:
		if cur.GitHub() {
			return bad() // its runner never talks to the facade
		}
		switch cur.Phase {
		case Started:
		case Registered, Running:
			return Record{}, fmt.Errorf("assignment: task %d: %w", cur.Task, ErrTokenRedeemed)
		default:
			return bad()
		}
		if ev.TokenID == "" || ev.TokenID != cur.TokenID {
			return Record{}, fmt.Errorf("assignment: task %d: token %s: %w", cur.Task, ev.TokenID, ErrTokenMismatch)
		}
		next.RunnerUUID = ev.RunnerUUID
	case Running:
		if cur.GitHub() {
			return decideJobStarted(cur, ev, next)
		}
		switch cur.Phase {
		case Registered:
		case Running:
			return Record{}, fmt.Errorf("assignment: task %d: %w", cur.Task, ErrAlreadyFetched)
		default:
			return bad()
		}
		if ev.RunnerUUID != cur.RunnerUUID {
			return Record{}, fmt.Errorf("assignment: task %d: runner %s is not the registered one: %w", cur.Task, ev.RunnerUUID, ErrInvalidTransition)
		}
		next.RunningAt = ev.At
	case Renewed:
		if cur.Phase == Failed {
			return bad()
		}
		if ev.Lease <= 0 {
			return Record{}, fmt.Errorf("assignment: task %d: renewal without a lease: %w", cur.Task, ErrInvalidTransition)
		}
		next.Phase = cur.Phase
		if exp := ev.At.Add(ev.Lease); exp.After(cur.LeaseExpires) {
			next.LeaseExpires = exp
		}
	case Completed:
		if cur.Phase != Running {
			return bad()
		}
		if ev.Result == "" {
			return Record{}, fmt.Errorf("assignment: task %d: completed without a result: %w", cur.Task, ErrInvalidTransition)
		}
		next.Result = ev.Result
	case Failed:
		if cur.Phase == Failed {
			return Record{}, ErrNoChange
		}
		if ev.Deadline {
			due, ok := Overdue(*cur, ev.At)
			if !ok {
				return Record{}, fmt.Errorf("assignment: task %d: %s at %s: %w", cur.Task, cur.Phase, ev.At.UTC().Format(time.RFC3339), ErrNotDue)
			}
			ev.Reason = due.Reason // the deadline that passed, as the current state has it
		}
		if ev.Reason == "" {
			return Record{}, fmt.Errorf("assignment: task %d: failed without a reason: %w", cur.Task, ErrInvalidTransition)
		}
		next.Reason = ev.Reason
		next.Result = "failure"
		next.FailedAt = ev.At
		next.Lost = ev.Lost && !ev.Deadline // a deadline is the job's own: it ran too long
	case Reporting:
		// Whoever appends this first reports the failure upstream; the compare-and-swap of the
		// append decides between schedulers racing for it. A claim that ran out (its holder
		// died before closing) may be taken over.
		if cur.Phase != Failed {
			return bad()
		}
		if ev.Lease <= 0 {
			return Record{}, fmt.Errorf("assignment: task %d: report claim without a duration: %w", cur.Task, ErrInvalidTransition)
		}
		if cur.Reporter != "" && ev.At.Before(cur.ReportUntil) {
			return Record{}, fmt.Errorf("assignment: task %d: %s reports until %s: %w", cur.Task, cur.Reporter,
				cur.ReportUntil.UTC().Format(time.RFC3339), ErrReportClaimed)
		}
		next.Phase = Failed
		next.Reason = cur.Reason
		next.Reporter, next.ReportUntil = ev.Actor, ev.At.Add(ev.Lease)
	case Closed:
		if cur.Phase != Failed {
			return bad()
		}
		next.Reason = cur.Reason
		next.Reporter, next.ReportUntil = cur.Reporter, cur.ReportUntil
	default:
		return Record{}, fmt.Errorf("assignment: unknown transition %q: %w", ev.Transition, ErrInvalidTransition)
	}
	return next, nil
}

// decideJobStarted records the job GitHub gave a slot's runner (a JobStarted message): once,
// for the slot's own runner, after its runner was configured.
func decideJobStarted(cur *State, ev Event, next Record) (Record, error) {
	switch {
	case cur.Phase == Running && cur.GitHubJob == ev.GitHubJob:
		return Record{}, ErrNoChange
	case cur.Phase == Running:
		return Record{}, fmt.Errorf("assignment: slot %d: runner took job %s, already running job %s: %w", cur.Task, ev.GitHubJob, cur.GitHubJob, ErrAlreadyFetched)
	case cur.Phase != Claimed && cur.Phase != Dispatched && cur.Phase != Started:
		return Record{}, fmt.Errorf("assignment: slot %d: running in phase %s: %w", cur.Task, cur.Phase, ErrInvalidTransition)
	case !cur.Ready():
		return Record{}, fmt.Errorf("assignment: slot %d: running before its runner was configured: %w", cur.Task, ErrInvalidTransition)
	case ev.RunnerID != cur.RunnerID:
		return Record{}, fmt.Errorf("assignment: slot %d: job started on runner %d, not the slot's runner %d: %w", cur.Task, ev.RunnerID, cur.RunnerID, ErrInvalidTransition)
	case ev.GitHubJob == "":
		return Record{}, fmt.Errorf("assignment: slot %d: running without a job id: %w", cur.Task, ErrInvalidTransition)
	}
	next.RunningAt = ev.At
	next.GitHubJob, next.RunID = ev.GitHubJob, ev.RunID
	next.Repo, next.Job = ev.Repo, ev.Job
	return next, nil
}

func decideClaim(cur *State, ev Event) (Record, error) {
	if cur != nil {
		return Record{}, fmt.Errorf("assignment: task %d: %w", cur.Task, ErrExists)
	}
	if ev.Task <= 0 {
		return Record{}, fmt.Errorf("assignment: claim without a task id: %w", ErrInvalidTransition)
	}
	switch ev.Forge {
	case ForgeGitea:
		if ev.Task.Slot() {
			return Record{}, fmt.Errorf("assignment: claim of Gitea task %d, in GitHub's slot range: %w", ev.Task, ErrInvalidTransition)
		}
	case ForgeGitHub:
		if !ev.Task.Slot() || ev.ScaleSet <= 0 || ev.RunnerName == "" || ev.Queue != 0 {
			return Record{}, fmt.Errorf("assignment: claim of GitHub slot %d needs a slot id, its scale set and runner name, and no queue: %w", ev.Task, ErrInvalidTransition)
		}
	default:
		return Record{}, fmt.Errorf("assignment: claim from forge %q: %w", ev.Forge, ErrInvalidTransition)
	}
	if ev.Backend != BackendPod && ev.Backend != BackendVM {
		return Record{}, fmt.Errorf("assignment: claim with backend %q: %w", ev.Backend, ErrInvalidTransition)
	}
	if ev.Lease <= 0 || ev.Pickup <= 0 || ev.Pickup >= ev.Lease {
		return Record{}, fmt.Errorf("assignment: claim with lease %s and pickup %s: pickup must be positive and below the lease: %w",
			ev.Lease, ev.Pickup, ErrInvalidTransition)
	}
	if ev.TaskDigest == "" && ev.Forge != ForgeGitHub { // a slot's configuration is sealed later, by `configured`
		return Record{}, fmt.Errorf("assignment: claim without a task digest: %w", ErrInvalidTransition)
	}
	if ev.Queue < 0 {
		return Record{}, fmt.Errorf("assignment: claim with queue time %s: %w", ev.Queue, ErrInvalidTransition)
	}
	phase, queueDeadline := Claimed, time.Time{}
	if ev.Queue > 0 {
		phase, queueDeadline = Queued, ev.At.Add(ev.Queue)
	}
	return Record{
		Transition:     Claimed,
		Phase:          phase,
		QueueDeadline:  queueDeadline,
		Task:           ev.Task,
		Backend:        ev.Backend,
		Actor:          ev.Actor,
		At:             ev.At,
		Repo:           ev.Repo,
		Job:            ev.Job,
		RunsOn:         ev.RunsOn,
		Fork:           ev.Fork,
		ForgeURL:       ev.ForgeURL,
		ClaimedAt:      ev.At,
		PickupDeadline: ev.At.Add(ev.Pickup),
		LeaseExpires:   ev.At.Add(ev.Lease),
		TaskDigest:     ev.TaskDigest,
		Forge:          ev.Forge,
		ScaleSet:       ev.ScaleSet,
		RunnerName:     ev.RunnerName,
	}, nil
}

// RenewEvery is how often an environment renews its lease of length lease: a third of it, in
// whole seconds (rounded down), the unit environments are told it in (executor.Config.Renew).
func RenewEvery(lease time.Duration) time.Duration { return (lease / 3).Truncate(time.Second) }

// RestartGrace is how long after a start the scheduler and the facade let environments reach
// them again before enforcing deadlines that passed while they were down: two renewal
// intervals.
func RestartGrace(lease time.Duration) time.Duration { return 2 * lease / 3 }

// Overdue returns the failure event that time now calls for, if any: a queued claim got no
// capacity before its queue deadline, the pickup deadline passed before the environment's
// runner fetched the task, or the lease expired. A queued claim has no pickup deadline or lease
// yet: both start at its admission.
func Overdue(s State, now time.Time) (Event, bool) {
	if !s.Active() {
		return Event{}, false
	}
	reason := ""
	switch {
	case s.Phase == Queued:
		if !now.After(s.QueueDeadline) {
			return Event{}, false
		}
		reason = fmt.Sprintf("the fleet was full: no %s environment became free within %s of the claim (QUEUE_SECS); retry the job when the fleet is less busy",
			s.Backend, s.QueueDeadline.Sub(s.ClaimedAt).Round(time.Second))
	case s.Phase != Running && now.After(s.PickupDeadline) && s.GitHub():
		reason = fmt.Sprintf("GitHub gave the slot's runner no job within %s of its creation (GITHUB_IDLE_SECS); the runner is removed, and a job still waiting gets another slot",
			s.PickupDeadline.Sub(s.ClaimedAt).Round(time.Second))
	case s.Phase != Running && now.After(s.PickupDeadline):
		since := "claim"
		if !s.AdmittedAt.IsZero() {
			since = "admission"
		}
		reason = fmt.Sprintf("no environment picked the task up within %s of its %s (PICKUP_SECS)", s.PickupDeadline.Sub(s.PickupFrom()).Round(time.Second), since)
	case now.After(s.LeaseExpires) && s.GitHub():
		reason = fmt.Sprintf("the slot's job ran past its lease, which ended at %s (a slot is not renewed: its lease is the longest job it may run)", s.LeaseExpires.UTC().Format(time.RFC3339))
	case now.After(s.LeaseExpires):
		reason = fmt.Sprintf("the environment's lease expired at %s without renewal", s.LeaseExpires.UTC().Format(time.RFC3339))
	default:
		return Event{}, false
	}
	return Event{Transition: Failed, Task: s.Task, Epoch: s.Epoch(), At: now, Reason: reason, Deadline: true}, true
}
