package assignment

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Backend names the isolation tier an assignment runs on.
type Backend string

// The isolation tiers. A task is routed by its `runs-on` labels to exactly one of them.
const (
	BackendPod Backend = "pod"
	BackendVM  Backend = "vm"
)

// ParseBackend accepts "pod" or "vm".
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(s); b {
	case BackendPod, BackendVM:
		return b, nil
	}
	return "", fmt.Errorf("assignment: backend %q: want pod or vm: %w", s, ErrInvalidID)
}

// Forge names the forge an assignment's job comes from.
type Forge string

// The forges. Gitea is the zero value: records written before GitHub existed name none.
const (
	ForgeGitea  Forge = ""
	ForgeGitHub Forge = "github"
)

// String names the forge, gitea for the zero value.
func (f Forge) String() string {
	if f == ForgeGitea {
		return "gitea"
	}
	return string(f)
}

// SlotBase is the first task id of a GitHub slot. GitHub has no task a runner fetches: each
// environment is a slot of a runner scale set, whose id dynrunner makes (SlotBase plus a
// number), so slots share the streams, the view and the workers with Gitea's tasks, whose ids
// stay below it.
const SlotBase TaskID = 1 << 52

// Slot reports whether t is a GitHub slot's id.
func (t TaskID) Slot() bool { return t >= SlotBase }

// Transition names one append to an assignment's log.
type Transition string

// The transitions, in the order a successful job goes through them. Renewed may repeat at any
// point before the end; failed can follow any non-terminal one and is followed by closed once
// the forge has been told; reporting, between them, names the one scheduler that tells it. A
// claim made while its tier is full (with an admission queue, MAX_QUEUED) is recorded in phase
// queued, and admitted later: admitted returns it to phase claimed, from where it goes on as
// any claim.
const (
	Claimed    Transition = "claimed"    // the scheduler persisted the task; its sequence is the epoch
	Configured Transition = "configured" // GitHub slots only: the JIT runner exists, its configuration is sealed (phase stays claimed)
	Queued     Transition = "queued"     // phase only: a claim that waits for capacity (MAX_QUEUED), recorded by its claim
	Admitted   Transition = "admitted"   // a queued claim got capacity; its phase is claimed again, its deadlines count from here
	Dispatched Transition = "dispatched" // a worker took the dispatch message
	Started    Transition = "started"    // the environment exists; its handle and token id are recorded
	Registered Transition = "registered" // the environment redeemed its single-use capability token
	Running    Transition = "running"    // the environment's runner fetched the task (exactly once)
	Renewed    Transition = "renewed"    // the lease was extended; the epoch stays
	Completed  Transition = "completed"  // the runner reported the final result upstream (terminal)
	Failed     Transition = "failed"     // the assignment cannot finish; the forge must be told
	Reporting  Transition = "reporting"  // one scheduler claimed the failure report (phase stays failed)
	Closed     Transition = "closed"     // the failure was reported upstream (terminal)
)

// Phase is where an assignment stands: the last transition other than Renewed, Reporting,
// Configured and Admitted (which keep or restore the phase), or Queued for a claim that waits
// for capacity.
//
// A GitHub slot goes claimed (the intent, before GitHub is called), configured (its JIT runner
// exists and the configuration is sealed), dispatched, started, running (a JobStarted message
// named its runner: GitHub gave it a job) and completed (JobCompleted). It is never
// registered: its runner talks to GitHub, not to the facade. A slot whose runner got no job
// before its pickup deadline fails, and its report to the forge is the runner's removal.
type Phase = Transition

// Terminal reports whether no transition can follow p.
func Terminal(p Phase) bool { return p == Completed || p == Closed }

// InFlightPhase reports whether an assignment in phase p holds capacity of its tier: it is
// neither terminal, failed, nor waiting in the admission queue. State.InFlight is this
// predicate; tallies that count assignments by phase use it directly.
func InFlightPhase(p Phase) bool { return !Terminal(p) && p != Failed && p != Queued }

// Record is one append to an assignment's subject. Every record carries the assignment's whole
// non-secret state, so the last record of a subject is its current state. The task itself
// (secrets, tokens, workflow payload) is sealed and stored apart; Record never holds a secret.
type Record struct {
	Transition Transition `json:"transition"`
	Phase      Phase      `json:"phase"`
	Task       TaskID     `json:"task_id"`
	// Epoch is the fencing epoch. It is zero in the claim record itself, whose own sequence is
	// the epoch; use State.Epoch.
	Epoch   Epoch     `json:"epoch,omitempty"`
	Backend Backend   `json:"backend"`
	Actor   string    `json:"actor"`
	At      time.Time `json:"at"`

	// Descriptive fields copied from the forge task, for operators.
	Repo   string   `json:"repo,omitempty"`
	Job    string   `json:"job,omitempty"`
	RunsOn []string `json:"runs_on,omitempty"`
	// Fork: the job runs for a pull request from a fork (its head repository is not Repo);
	// GRANTS_FILE's forks bound applies to it.
	Fork bool `json:"fork,omitempty"`
	// ForgeURL is the forge's own URL as the task names it (Gitea's ROOT_URL); environments
	// hand it to the job as its server URL.
	ForgeURL ForgeURL `json:"forge_url,omitempty"`

	ClaimedAt time.Time `json:"claimed_at"`
	// QueueDeadline is when a queued claim that got no capacity fails (QUEUE_SECS after its
	// claim); AdmittedAt when it got capacity. Both zero for a claim that never queued.
	QueueDeadline  time.Time `json:"queue_deadline,omitzero"`
	AdmittedAt     time.Time `json:"admitted_at,omitzero"`
	PickupDeadline time.Time `json:"pickup_deadline"`
	LeaseExpires   time.Time `json:"lease_expires"`
	// TaskDigest is the SHA-256 of the sealed task blob, checked when it is read back.
	TaskDigest string `json:"task_digest,omitempty"`

	// Handle is the backend's environment handle, recorded when it started.
	Handle json.RawMessage `json:"handle,omitempty"`
	// StartedBy is the actor that recorded `started`, for the audit trail. Which worker watches
	// the environment now is in the workers' liveness bucket (podworker), not here.
	StartedBy string `json:"started_by,omitempty"`
	// TokenID identifies (never reveals) the capability token issued to the environment.
	TokenID    string `json:"token_id,omitempty"`
	RunnerUUID string `json:"runner_uuid,omitempty"`

	// Forge is where the job comes from (empty: Gitea). A GitHub slot also records its runner
	// scale set and its JIT runner's name (from the claim), the runner's id (from
	// `configured`), and the job GitHub gave that runner (GitHubJob, RunID; from `running`,
	// after the fact: GitHub binds a job to a runner, dynrunner cannot choose which).
	Forge      Forge  `json:"forge,omitempty"`
	ScaleSet   int    `json:"scale_set,omitempty"`
	RunnerName string `json:"runner_name,omitempty"`
	RunnerID   int64  `json:"runner_id,omitempty"`
	GitHubJob  string `json:"github_job,omitempty"`
	RunID      int64  `json:"run_id,omitempty"`
	// RunningAt is when the environment's runner fetched the task: the job's start (from
	// `running` on).
	RunningAt time.Time `json:"running_at,omitzero"`

	Result string `json:"result,omitempty"`
	Reason string `json:"reason,omitempty"`
	// FailedAt is when the assignment failed (from `failed` on).
	FailedAt time.Time `json:"failed_at,omitzero"`
	// Lost: the assignment failed because its environment was lost before its job completed
	// (it was evicted, deleted or killed, or disappeared), not because the job ended or
	// exceeded its environment's limits (memory, deadline). Recorded with `failed` by the
	// worker that watched the environment. A GitHub slot's lost job is run again through
	// GitHub's rerun-failed-jobs (forge/github, Reruns).
	Lost bool `json:"lost,omitempty"`

	// Reporter is the actor that claimed the failure report (Reporting); no other may report
	// before ReportUntil, and Reporter itself reports only before it.
	Reporter    string    `json:"reporter,omitempty"`
	ReportUntil time.Time `json:"report_until,omitzero"`
}

// State is the current state of an assignment: its last record and that record's stream
// sequence (the compare-and-swap revision for the next append).
type State struct {
	Record
	Seq uint64 `json:"seq"`
}

// Epoch returns the assignment's fencing epoch.
func (s State) Epoch() Epoch {
	if s.Transition == Claimed {
		return Epoch(s.Seq)
	}
	return s.Record.Epoch
}

// GitHub reports whether the assignment is a GitHub slot.
func (s State) GitHub() bool { return s.Forge == ForgeGitHub }

// Ready reports whether the assignment can be dispatched: a Gitea task as soon as it is
// claimed, a GitHub slot once its runner is configured.
func (s State) Ready() bool { return !s.GitHub() || s.RunnerID != 0 }

// Live reports whether the assignment has not reached a terminal phase.
func (s State) Live() bool { return !Terminal(s.Phase) }

// Active reports whether the assignment's job can still run: it is live and has not failed. A
// failed assignment stays live until its failure is reported upstream (closed), but nothing is
// to run for it any more: its environment is to be destroyed, its deadlines no longer apply.
func (s State) Active() bool { return s.Live() && s.Phase != Failed }

// InFlight reports whether the assignment holds capacity of its tier: it is active and not
// waiting in the admission queue (InFlightPhase).
func (s State) InFlight() bool { return InFlightPhase(s.Phase) }

// Waiting reports whether the assignment waits in the admission queue for capacity: it is
// active and queued.
func (s State) Waiting() bool { return s.Active() && s.Phase == Queued }

// Owner returns the repository owner (user or organisation) of the assignment's job, lower
// case: the unit of admission fairness. "" when the forge named no repository.
func (s State) Owner() string { return OwnerOf(s.Repo) }

// OwnerOf returns the owner part of an "owner/name" repository, lower case.
func OwnerOf(repo string) string {
	owner, _, _ := strings.Cut(repo, "/")
	return strings.ToLower(owner)
}

// PickupFrom returns when the assignment's pickup deadline began to count: its admission, or
// its claim when it never queued.
func (s State) PickupFrom() time.Time {
	if !s.AdmittedAt.IsZero() {
		return s.AdmittedAt
	}
	return s.ClaimedAt
}
