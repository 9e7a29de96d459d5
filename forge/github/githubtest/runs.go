package githubtest

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// ErrRunRepository: a job was queued for a workflow run of another repository.
var ErrRunRepository = errors.New("workflow run belongs to another repository")

// Workflow run statuses and conclusions, as GitHub's REST API names them.
const (
	RunQueued     = "queued"
	RunInProgress = "in_progress"
	RunCompleted  = "completed"

	ConclusionSuccess   = "success"
	ConclusionFailure   = "failure"
	ConclusionCancelled = "cancelled"
)

// The answers of rerun-failed-jobs the fake gives when it refuses, with 403. The first is
// GitHub's, recorded by others (the GitHub CLI's users, cli/cli#9221); the second a guess.
const (
	MessageRunInProgress = "This workflow is already running"
	MessageNothingFailed = "githubtest: the workflow run has no failed jobs to re-run"
)

// workflowRun is a workflow run of one repository: its jobs are the jobs queued with its id,
// each of one attempt; the run's status and conclusion are those of its current attempt's.
type workflowRun struct {
	id          int64
	owner, repo string
	attempt     int
	started     time.Time // run_started_at: when the current attempt started
	reruns      int       // rerun-failed-jobs calls the fake accepted
}

// WorkflowRun is a snapshot of one workflow run.
type WorkflowRun struct {
	ID    int64
	Owner string
	Repo  string
	// Attempt is GitHub's run_attempt: 1, then one more per rerun.
	Attempt    int
	Status     string // RunQueued, RunInProgress or RunCompleted
	Conclusion string // with RunCompleted: ConclusionSuccess, ConclusionFailure or ConclusionCancelled
	StartedAt  time.Time
	// Reruns counts the rerun-failed-jobs calls the fake accepted for the run.
	Reruns int
}

// runLocked returns the workflow run spec's job belongs to, making it when it is new; s.mu
// must be held.
func (s *Server) runLocked(spec JobSpec) (*workflowRun, error) {
	run, ok := s.runs[spec.WorkflowRunID]
	if !ok {
		run = &workflowRun{id: spec.WorkflowRunID, owner: spec.Owner, repo: spec.Repository, attempt: 1, started: time.Now().UTC()}
		s.runs[run.id] = run
		return run, nil
	}
	if !strings.EqualFold(run.owner, spec.Owner) || !strings.EqualFold(run.repo, spec.Repository) {
		return nil, fmt.Errorf("githubtest: job for %s/%s in run %d of %s/%s: %w", spec.Owner, spec.Repository, run.id, run.owner, run.repo, ErrRunRepository)
	}
	return run, nil
}

// WorkflowRun returns a snapshot of workflow run id.
func (s *Server) WorkflowRun(id int64) (WorkflowRun, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	run, ok := s.runs[id]
	if !ok {
		return WorkflowRun{}, fmt.Errorf("githubtest: workflow run %d: %w", id, ErrUnknownJob)
	}
	status, conclusion := s.statusLocked(run)
	return WorkflowRun{ID: run.id, Owner: run.owner, Repo: run.repo, Attempt: run.attempt, Status: status, Conclusion: conclusion,
		StartedAt: run.started, Reruns: run.reruns}, nil
}

// RunJobs returns the jobs of workflow run id, every attempt's, by id.
func (s *Server) RunJobs(id int64) []Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Job
	for jid := int64(1); jid < s.nextJob; jid++ {
		if j, ok := s.jobs[jid]; ok && j.spec.WorkflowRunID == id {
			out = append(out, j.snapshot())
		}
	}
	return out
}

// attemptJobsLocked are the jobs of run's current attempt, by id; s.mu must be held.
func (s *Server) attemptJobsLocked(run *workflowRun) []*job {
	var out []*job
	for jid := int64(1); jid < s.nextJob; jid++ {
		if j, ok := s.jobs[jid]; ok && j.spec.WorkflowRunID == run.id && j.attempt == run.attempt {
			out = append(out, j)
		}
	}
	return out
}

// statusLocked is run's status and conclusion: completed once every job of its current
// attempt has, a failure if one of them failed, cancelled if one was cancelled, else a
// success; in progress while one runs or has run; queued before. s.mu must be held.
func (s *Server) statusLocked(run *workflowRun) (status, conclusion string) {
	jobs := s.attemptJobsLocked(run)
	done, failed, cancelled, started := 0, false, false, false
	for _, j := range jobs {
		switch j.state {
		case JobCompleted:
			done++
			started = true
			failed = failed || j.result == "failed"
			cancelled = cancelled || j.result == "canceled"
		case JobRunning:
			started = true
		}
	}
	switch {
	case len(jobs) > 0 && done == len(jobs) && failed:
		return RunCompleted, ConclusionFailure
	case len(jobs) > 0 && done == len(jobs) && cancelled:
		return RunCompleted, ConclusionCancelled
	case len(jobs) > 0 && done == len(jobs):
		return RunCompleted, ConclusionSuccess
	case started:
		return RunInProgress, ""
	}
	return RunQueued, ""
}

// runFromPath finds the run of the request's path, of the repository it names; it answers
// 404 itself, as GitHub does for a run of another repository.
func (s *Server) runFromPath(w http.ResponseWriter, r *http.Request) (*workflowRun, bool) {
	id, err := strconv.ParseInt(r.PathValue("run"), 10, 64)
	run, ok := s.runs[id]
	if err != nil || !ok || !strings.EqualFold(run.owner, r.PathValue("owner")) || !strings.EqualFold(run.repo, r.PathValue("repo")) {
		writeGitHubError(w, http.StatusNotFound, "Not Found")
		return nil, false
	}
	return run, true
}

// wireRun is the part of GitHub's workflow run object the fake answers.
type wireRun struct {
	ID           int64      `json:"id"`
	RunAttempt   int        `json:"run_attempt"`
	Status       string     `json:"status"`
	Conclusion   *string    `json:"conclusion"`
	RunStartedAt time.Time  `json:"run_started_at"`
	Repository   wireRunRep `json:"repository"`
}

type wireRunRep struct {
	FullName string `json:"full_name"`
}

// handleGetRun is GET /repos/{owner}/{repo}/actions/runs/{run}.
func (s *Server) handleGetRun(w http.ResponseWriter, r *http.Request) {
	if !s.restAuth(w, r) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	run, ok := s.runFromPath(w, r)
	if !ok {
		return
	}
	status, conclusion := s.statusLocked(run)
	out := wireRun{ID: run.id, RunAttempt: run.attempt, Status: status, RunStartedAt: run.started,
		Repository: wireRunRep{FullName: run.owner + "/" + run.repo}}
	if conclusion != "" {
		out.Conclusion = &conclusion
	}
	writeJSON(w, http.StatusOK, out)
}

// handleRerunFailedJobs is POST /repos/{owner}/{repo}/actions/runs/{run}/rerun-failed-jobs: a
// completed run whose current attempt has failed or cancelled jobs gets a new attempt, in which
// each of those jobs is queued again (a new job, JobAvailable to its scale set); 201 with {}.
// A run not completed is refused with 403 "This workflow is already running", as GitHub does;
// one with nothing failed with 403 too.
func (s *Server) handleRerunFailedJobs(w http.ResponseWriter, r *http.Request) {
	if !s.restAuth(w, r) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	run, ok := s.runFromPath(w, r)
	if !ok {
		return
	}
	if status, _ := s.statusLocked(run); status != RunCompleted {
		writeGitHubError(w, http.StatusForbidden, MessageRunInProgress)
		return
	}
	var again []JobSpec
	for _, j := range s.attemptJobsLocked(run) {
		if j.result == "failed" || j.result == "canceled" {
			spec := j.spec
			spec.JobID = uuid.NewString()
			again = append(again, spec)
		}
	}
	if len(again) == 0 {
		writeGitHubError(w, http.StatusForbidden, MessageNothingFailed)
		return
	}
	run.attempt++
	run.reruns++
	run.started = time.Now().UTC()
	for _, spec := range again {
		if _, err := s.queueLocked(spec); err != nil {
			writeGitHubError(w, http.StatusInternalServerError, "githubtest: queue the job again: "+err.Error())
			return
		}
	}
	writeJSON(w, http.StatusCreated, map[string]any{})
}
