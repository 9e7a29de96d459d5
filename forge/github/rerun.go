package github

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// RerunState is where a workflow run's rerun stands (Rerun.State).
type RerunState string

// The states of a Rerun. A round begins pending when a lost slot of the run is noted, and ends
// asked or skipped; a slot of the run lost later, in the attempt the rerun started, begins the
// next round.
const (
	// RerunPending: lost slots are noted; dynrunner waits for the run to complete.
	RerunPending RerunState = "pending"
	// RerunAsking: one scheduler claimed the call to rerun-failed-jobs (Asker, until AskUntil).
	RerunAsking RerunState = "asking"
	// RerunAsked: GitHub accepted the rerun (Outcome OutcomeRerun).
	RerunAsked RerunState = "asked"
	// RerunSkipped: no rerun this round; Outcome and Reason say why.
	RerunSkipped RerunState = "skipped"
)

// The outcomes of a round, in Rerun.Outcome and dynrunner_github_reruns_total.
const (
	// OutcomeRerun: GitHub accepted rerun-failed-jobs.
	OutcomeRerun = "rerun"
	// OutcomeCovered: the run was run again before dynrunner asked (someone reran it).
	OutcomeCovered = "covered"
	// OutcomeBound: dynrunner has asked for GITHUB_RERUNS reruns of the run already.
	OutcomeBound = "bound"
	// OutcomeNotFailed: the run completed without a failure (its job ended before its
	// environment did, or the run was cancelled): nothing to rerun.
	OutcomeNotFailed = "not_failed"
	// OutcomeGone: GitHub does not know the run (deleted, or the credentials cannot see it).
	OutcomeGone = "gone"
	// OutcomeGaveUp: the calls failed rerunMaxTries times, or the run did not complete
	// within rerunMaxWait.
	OutcomeGaveUp = "gave_up"
	// OutcomeRefused: no authentic record of a lost slot of the run backs the rerun record.
	OutcomeRefused = "refused"
)

// Rerun is the record of one workflow run in eventlog.BucketGitHubReruns, key run.<run_id>:
// the lost slots that call for running its failed jobs again, and how far that went. Every
// change is one compare-and-swap update of the key (decideRerun); its history is the audit
// trail. The record is a pointer, never an authority: before GitHub is called, a slot it names
// must have an authentic `failed` record that lost its environment, for this run and repository.
type Rerun struct {
	Run     int64      `json:"run_id"`
	Repo    string     `json:"repo"`
	State   RerunState `json:"state"`
	Outcome string     `json:"outcome,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	// Slots are the lost slots noted for the run, every round's (the last rerunMaxSlots).
	Slots []assignment.TaskID `json:"slots"`
	// Since is when the round's first loss was noted.
	Since time.Time `json:"since"`
	// Attempt is the run's attempt (GitHub's run_attempt) the round is for: the one seen
	// while its lost job had not been concluded yet, or the one the rerun was asked for.
	Attempt int `json:"attempt,omitempty"`
	// Reruns counts the reruns dynrunner asked for the run, every round's; GITHUB_RERUNS bounds it.
	Reruns int `json:"reruns"`
	// Tries counts the round's failed calls to rerun-failed-jobs; LastError is the last one's.
	Tries     int    `json:"tries,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Unsure: the last call got no answer (it timed out, the connection broke), so GitHub may
	// have accepted it: a run whose attempt grew since counts as rerun by dynrunner.
	Unsure bool `json:"unsure,omitempty"`
	// Asker claimed the call until AskUntil (asking); the claimer whose call GitHub accepted
	// (asked).
	Asker    string    `json:"asker,omitempty"`
	AskUntil time.Time `json:"ask_until,omitzero"`
	// DecidedAt is when the round's call was first claimed, or the round was skipped: a slot
	// whose job started before it belongs to this round, one whose job started after it to
	// an attempt the round's rerun began.
	DecidedAt time.Time `json:"decided_at,omitzero"`
	Actor     string    `json:"actor"`
	At        time.Time `json:"at"`
}

// Final reports whether the round ended (asked or skipped).
func (r Rerun) Final() bool { return r.State == RerunAsked || r.State == RerunSkipped }

// RerunKey is the key of workflow run runID in eventlog.BucketGitHubReruns.
func RerunKey(runID int64) string { return "run." + strconv.FormatInt(runID, 10) }

// rerunMaxSlots bounds Rerun.Slots, so a run losing many environments keeps a small record.
const rerunMaxSlots = 64

// Errors of decideRerun.
var (
	errRerunNoChange = errors.New("github: rerun: no change")
	// errRerunClaimed: another scheduler's claim of the call holds.
	errRerunClaimed = errors.New("github: rerun: the call is claimed by another scheduler")
	// errRerunBusy: a loss from an attempt after the one being asked for; noted once the
	// call is recorded.
	errRerunBusy = errors.New("github: rerun: the run's rerun is being asked for; the loss is noted after it")
	// errRerunInvalid: the event does not apply to the record.
	errRerunInvalid = errors.New("github: rerun: invalid")
)

// rerunKind names one change of a Rerun.
type rerunKind int

const (
	// rerunNote: a slot of the run lost its environment (slot, repo, run, runningAt).
	rerunNote rerunKind = iota + 1
	// rerunObserve: the run's attempt, seen before it completed (attempt).
	rerunObserve
	// rerunClaim: claim the call for the run's completed attempt (attempt, hold).
	rerunClaim
	// rerunAsked: GitHub accepted the rerun, or the run's attempt grew past the claimed one
	// (the claimer's call went through before it could record it, or a call that got no
	// answer did).
	rerunAsked
	// rerunFail: the claimed call failed (err); the round is pending again, or gives up after
	// maxTries.
	rerunFail
	// rerunSkip: the round ends without a rerun (outcome, reason).
	rerunSkip
)

// rerunEvent asks for one change of a Rerun.
type rerunEvent struct {
	kind      rerunKind
	actor     string
	at        time.Time
	slot      assignment.TaskID
	repo      string
	run       int64
	runningAt time.Time
	attempt   int
	hold      time.Duration
	outcome   string
	reason    string
	err       string
	unsure    bool
	maxTries  int
}

// decideRerun computes the record applying ev to cur appends; cur is nil when the run has
// none. It is a pure function: no I/O, no clock.
func decideRerun(cur *Rerun, ev rerunEvent) (Rerun, error) {
	if ev.kind == rerunNote {
		return decideNote(cur, ev)
	}
	if cur == nil {
		return Rerun{}, fmt.Errorf("%w: no record of the run", errRerunInvalid)
	}
	next := *cur
	next.Slots = slices.Clone(cur.Slots)
	next.Actor, next.At = ev.actor, ev.at
	bad := func() (Rerun, error) {
		return Rerun{}, fmt.Errorf("%w: change %d in state %s", errRerunInvalid, ev.kind, cur.State)
	}
	switch ev.kind {
	case rerunObserve:
		if cur.State != RerunPending || cur.Attempt != 0 || ev.attempt <= 0 {
			return Rerun{}, errRerunNoChange
		}
		next.Attempt = ev.attempt
	case rerunClaim:
		switch {
		case cur.State == RerunAsking && ev.at.Before(cur.AskUntil):
			return Rerun{}, fmt.Errorf("%w: %s until %s", errRerunClaimed, cur.Asker, cur.AskUntil.UTC().Format(time.RFC3339))
		case cur.State != RerunPending && cur.State != RerunAsking:
			return bad()
		case ev.attempt <= 0 || ev.hold <= 0 || (cur.Attempt != 0 && ev.attempt != cur.Attempt):
			return Rerun{}, fmt.Errorf("%w: claim for attempt %d of a round for attempt %d", errRerunInvalid, ev.attempt, cur.Attempt)
		}
		next.State, next.Attempt = RerunAsking, ev.attempt
		next.Asker, next.AskUntil = ev.actor, ev.at.Add(ev.hold)
		if next.DecidedAt.IsZero() {
			next.DecidedAt = ev.at
		}
	case rerunAsked:
		if cur.State != RerunAsking && (cur.State != RerunPending || !cur.Unsure) {
			return bad()
		}
		next.Unsure = false
		next.State, next.Outcome, next.Reason = RerunAsked, OutcomeRerun, ""
		next.Reruns++
		next.AskUntil = time.Time{} // Asker stays: the claimer, whose call GitHub accepted
	case rerunFail:
		if cur.State != RerunAsking {
			return bad()
		}
		next.State, next.Asker, next.AskUntil = RerunPending, "", time.Time{}
		next.Tries++
		next.LastError, next.Unsure = ev.err, ev.unsure
		if next.Tries >= ev.maxTries {
			next.State, next.Outcome = RerunSkipped, OutcomeGaveUp
			next.Reason = fmt.Sprintf("rerun-failed-jobs failed %d times, the last: %s", next.Tries, ev.err)
		}
	case rerunSkip:
		if cur.State != RerunPending && cur.State != RerunAsking {
			return bad()
		}
		next.State, next.Outcome, next.Reason = RerunSkipped, ev.outcome, ev.reason
		next.Asker, next.AskUntil = "", time.Time{}
		if next.DecidedAt.IsZero() {
			next.DecidedAt = ev.at
		}
	default:
		return bad()
	}
	return next, nil
}

// decideNote notes a lost slot of the run: the first begins the record; one whose job started
// after the last round was decided begins the next round; others join the current round.
func decideNote(cur *Rerun, ev rerunEvent) (Rerun, error) {
	if ev.slot <= 0 || ev.run <= 0 || ev.repo == "" || ev.runningAt.IsZero() {
		return Rerun{}, fmt.Errorf("%w: a loss without its slot, run, repository or job start", errRerunInvalid)
	}
	if cur == nil {
		return Rerun{Run: ev.run, Repo: ev.repo, State: RerunPending, Slots: []assignment.TaskID{ev.slot},
			Since: ev.at, Actor: ev.actor, At: ev.at}, nil
	}
	switch {
	case cur.Run != ev.run || !strings.EqualFold(cur.Repo, ev.repo):
		return Rerun{}, fmt.Errorf("%w: slot %d lost a job of run %d of %s; the record is run %d of %s", errRerunInvalid, ev.slot, ev.run, ev.repo, cur.Run, cur.Repo)
	case slices.Contains(cur.Slots, ev.slot):
		return Rerun{}, errRerunNoChange
	case cur.State == RerunAsking && !ev.runningAt.Before(cur.DecidedAt):
		return Rerun{}, errRerunBusy
	}
	next := *cur
	next.Slots = append(slices.Clone(cur.Slots), ev.slot)
	if len(next.Slots) > rerunMaxSlots {
		next.Slots = next.Slots[len(next.Slots)-rerunMaxSlots:]
	}
	next.Actor, next.At = ev.actor, ev.at
	if cur.Final() && !ev.runningAt.Before(cur.DecidedAt) {
		// A job of a later attempt: the next round.
		next.State, next.Outcome, next.Reason = RerunPending, "", ""
		next.Since, next.Attempt, next.Tries, next.LastError = ev.at, 0, 0, ""
		next.Asker, next.AskUntil, next.DecidedAt = "", time.Time{}, time.Time{}
	}
	return next, nil
}

// rerunStep is what to do for a pending or asking round, given the run as GitHub has it.
type rerunStep int

const (
	// stepWait: nothing now; read the run again later.
	stepWait rerunStep = iota + 1
	// stepObserve: record the attempt of the run, which has not completed.
	stepObserve
	// stepAsk: claim the call and ask GitHub for the rerun.
	stepAsk
	// stepConfirm: an earlier claimer's call went through (the run's attempt grew); record it
	// asked without calling again.
	stepConfirm
	// stepSkip: end the round without a rerun (outcome, reason).
	stepSkip
)

// rerunPlan is planRerun's answer.
type rerunPlan struct {
	step    rerunStep
	outcome string
	reason  string
}

// planRerun decides a round that is not final, given the run GitHub answered, the time and
// the bound (GITHUB_RERUNS). It is a pure function.
func planRerun(r Rerun, run WorkflowRun, now time.Time, bound int) rerunPlan {
	if r.State == RerunAsking && now.Before(r.AskUntil) {
		return rerunPlan{step: stepWait} // its claimer asks
	}
	if (r.State == RerunAsking || r.Unsure) && run.Attempt > r.Attempt {
		// A claimer that died after calling, or a call that got no answer, went through.
		return rerunPlan{step: stepConfirm}
	}
	if r.Attempt != 0 && run.Attempt > r.Attempt {
		return rerunPlan{step: stepSkip, outcome: OutcomeCovered,
			reason: fmt.Sprintf("the run was run again (attempt %d) before dynrunner asked: the lost jobs of attempt %d run again in it", run.Attempt, r.Attempt)}
	}
	if !run.Completed() {
		if r.State == RerunPending && r.Attempt == 0 {
			return rerunPlan{step: stepObserve}
		}
		return rerunPlan{step: stepWait}
	}
	switch {
	case !run.Failed():
		return rerunPlan{step: stepSkip, outcome: OutcomeNotFailed,
			reason: fmt.Sprintf("attempt %d of the run concluded %q: no failed job to rerun", run.Attempt, run.Conclusion)}
	case r.Reruns >= bound:
		return rerunPlan{step: stepSkip, outcome: OutcomeBound,
			reason: fmt.Sprintf("dynrunner asked for %d reruns of the run already (GITHUB_RERUNS=%d)", r.Reruns, bound)}
	}
	return rerunPlan{step: stepAsk}
}
