package devforge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultWaitTimeout bounds [Forge.WaitRun] when ctx has no deadline.
const DefaultWaitTimeout = 10 * time.Minute

// pollInterval is how often WaitRun asks Gitea; the API is local and cheap.
const pollInterval = 250 * time.Millisecond

// Status and conclusion values of runs and jobs, as Gitea's API reports them.
const (
	StatusQueued     = "queued"
	StatusWaiting    = "waiting" // blocked by needs/concurrency
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"

	ConclusionSuccess   = "success"
	ConclusionFailure   = "failure"
	ConclusionCancelled = "cancelled"
	ConclusionSkipped   = "skipped"
)

// Run is a workflow run with its jobs.
type Run struct {
	ID         int64
	RunNumber  int64
	Attempt    int64
	HeadSHA    string
	Event      string
	Path       string // workflow file, e.g. "ci.yml@refs/heads/main"
	Status     string // Status* constants
	Conclusion string // Conclusion* constants, set once completed
	StartedAt  time.Time
	EndedAt    time.Time
	Jobs       []Job
}

// Job is one job of a run.
type Job struct {
	ID         int64
	RunID      int64
	Name       string
	Labels     []string // runs-on
	Status     string   // Status* constants
	Conclusion string   // Conclusion* constants, set once completed
	RunnerID   int64
	RunnerName string
	CreatedAt  time.Time
	StartedAt  time.Time
	EndedAt    time.Time
}

// Succeeded reports whether the run and every job completed with success (or were skipped).
func (r Run) Succeeded() bool {
	if r.Status != StatusCompleted || r.Conclusion != ConclusionSuccess {
		return false
	}
	for _, j := range r.Jobs {
		if j.Status != StatusCompleted || (j.Conclusion != ConclusionSuccess && j.Conclusion != ConclusionSkipped) {
			return false
		}
	}
	return true
}

// Job returns the job called name.
func (r Run) Job(name string) (Job, bool) {
	for _, j := range r.Jobs {
		if j.Name == name {
			return j, true
		}
	}
	return Job{}, false
}

func (r Run) finished() bool {
	if r.Status != StatusCompleted || len(r.Jobs) == 0 {
		return false
	}
	for _, j := range r.Jobs {
		if j.Status != StatusCompleted {
			return false
		}
	}
	return true
}

// summary describes a run's progress for error messages.
func (r Run) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %d %s", r.ID, r.Status)
	for _, j := range r.Jobs {
		fmt.Fprintf(&b, "; job %q (%d) %s", j.Name, j.ID, j.Status)
		if j.Conclusion != "" {
			fmt.Fprintf(&b, "/%s", j.Conclusion)
		}
		if j.Status == StatusQueued {
			fmt.Fprintf(&b, " runs-on %v", j.Labels)
		}
	}
	return b.String()
}

// WaitRun waits until the run for commit sha on repo exists and it and all its jobs have
// completed, and returns it. sha "" means the newest run of the repository, which may be an
// older, already finished run if the new one has not been created yet: prefer the SHA from
// [Forge.PushWorkflow]. A finished run is returned without error whatever its conclusion; check
// [Run.Succeeded]. WaitRun polls until ctx ends, at most [DefaultWaitTimeout] if ctx has no
// deadline; the error then describes the last state seen.
func (f *Forge) WaitRun(ctx context.Context, repo Repo, sha string) (Run, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultWaitTimeout)
		defer cancel()
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	last := "no run yet"
	for {
		run, found, err := f.latestRun(ctx, repo, sha)
		switch {
		case err != nil && ctx.Err() == nil:
			return Run{}, err
		case err == nil && found:
			if run.Jobs, err = f.Jobs(ctx, repo, run.ID); err != nil && ctx.Err() == nil {
				return Run{}, err
			}
			if err == nil {
				if run.finished() {
					return run, nil
				}
				last = run.summary()
			}
		}
		select {
		case <-ctx.Done():
			return Run{}, fmt.Errorf("devforge: wait for run of %s at %q: %s: %w", repo, sha, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// Runs lists the runs of repo, newest first (first page of 50). sha "" lists all.
func (f *Forge) Runs(ctx context.Context, repo Repo, sha string) ([]Run, error) {
	q := url.Values{"limit": {"50"}}
	if sha != "" {
		q.Set("head_sha", sha)
	}
	var out struct {
		Runs []struct {
			ID          int64     `json:"id"`
			RunNumber   int64     `json:"run_number"`
			RunAttempt  int64     `json:"run_attempt"`
			HeadSHA     string    `json:"head_sha"`
			Event       string    `json:"event"`
			Path        string    `json:"path"`
			Status      string    `json:"status"`
			Conclusion  string    `json:"conclusion"`
			StartedAt   time.Time `json:"started_at"`
			CompletedAt time.Time `json:"completed_at"`
		} `json:"workflow_runs"`
	}
	if err := f.do(ctx, http.MethodGet, repo.apiPath()+"/actions/runs?"+q.Encode(), nil, &out); err != nil {
		return nil, err
	}
	runs := make([]Run, 0, len(out.Runs))
	for _, r := range out.Runs {
		runs = append(runs, Run{
			ID: r.ID, RunNumber: r.RunNumber, Attempt: r.RunAttempt, HeadSHA: r.HeadSHA, Event: r.Event,
			Path: r.Path, Status: r.Status, Conclusion: r.Conclusion, StartedAt: r.StartedAt, EndedAt: r.CompletedAt,
		})
	}
	return runs, nil
}

func (f *Forge) latestRun(ctx context.Context, repo Repo, sha string) (Run, bool, error) {
	runs, err := f.Runs(ctx, repo, sha)
	if err != nil || len(runs) == 0 {
		return Run{}, false, err
	}
	newest := runs[0]
	for _, r := range runs[1:] {
		if r.ID > newest.ID {
			newest = r
		}
	}
	return newest, true, nil
}

// Jobs lists the jobs of run runID (latest attempt).
func (f *Forge) Jobs(ctx context.Context, repo Repo, runID int64) ([]Job, error) {
	var out struct {
		Jobs []struct {
			ID          int64     `json:"id"`
			RunID       int64     `json:"run_id"`
			Name        string    `json:"name"`
			Labels      []string  `json:"labels"`
			Status      string    `json:"status"`
			Conclusion  string    `json:"conclusion"`
			RunnerID    int64     `json:"runner_id"`
			RunnerName  string    `json:"runner_name"`
			CreatedAt   time.Time `json:"created_at"`
			StartedAt   time.Time `json:"started_at"`
			CompletedAt time.Time `json:"completed_at"`
		} `json:"jobs"`
	}
	if err := f.do(ctx, http.MethodGet, fmt.Sprintf("%s/actions/runs/%d/jobs?limit=50", repo.apiPath(), runID), nil, &out); err != nil {
		return nil, err
	}
	jobs := make([]Job, 0, len(out.Jobs))
	for _, j := range out.Jobs {
		jobs = append(jobs, Job{
			ID: j.ID, RunID: j.RunID, Name: j.Name, Labels: j.Labels, Status: j.Status, Conclusion: j.Conclusion,
			RunnerID: j.RunnerID, RunnerName: j.RunnerName, CreatedAt: j.CreatedAt, StartedAt: j.StartedAt, EndedAt: j.CompletedAt,
		})
	}
	return jobs, nil
}

// ErrNoLog is returned (wrapped) by [Forge.JobLog] when the job has not started or its log is
// gone.
var ErrNoLog = errors.New("devforge: job has no log")

// JobLog returns the job's log as Gitea serves it: one line per row, each starting with an
// RFC 3339 timestamp. The log is complete once the job has completed (the runner sends its last
// rows before the final state).
func (f *Forge) JobLog(ctx context.Context, repo Repo, jobID int64) (string, error) {
	var log string
	err := f.do(ctx, http.MethodGet, fmt.Sprintf("%s/actions/jobs/%d/logs", repo.apiPath(), jobID), nil, &log)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
		return "", fmt.Errorf("%w: job %d of %s: %s", ErrNoLog, jobID, repo, strings.TrimSpace(apiErr.Body))
	}
	return log, err
}
