package githubtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Errors of the Go API, for errors.Is.
var (
	// ErrUnknownScaleSet: no scale set has that id.
	ErrUnknownScaleSet = errors.New("unknown runner scale set")
	// ErrNoScaleSet: no scale set carries all of the job's labels.
	ErrNoScaleSet = errors.New("no runner scale set carries all the labels")
	// ErrUnknownJob: no job has that id.
	ErrUnknownJob = errors.New("unknown job")
	// ErrJobState: the job is not in the state the call needs.
	ErrJobState = errors.New("job is in the wrong state")
	// ErrNoIdleRunner: the job's scale set has no idle runner (or not the one named).
	ErrNoIdleRunner = errors.New("no idle runner of the job's scale set")
)

// JobState is where a job is in its life.
type JobState string

// The states of a job, in order.
const (
	JobQueued    JobState = "queued"    // available, not acquired
	JobAcquired  JobState = "acquired"  // acquired by the listener
	JobAssigned  JobState = "assigned"  // assigned to the scale set
	JobRunning   JobState = "running"   // started on a runner
	JobCompleted JobState = "completed" // finished, with a result
)

// JobSpec describes a job to queue. Labels are its runs-on labels; the other fields are copied
// into its messages (defaults fill what is empty).
type JobSpec struct {
	Labels        []string
	Owner         string
	Repository    string
	WorkflowRef   string
	DisplayName   string
	EventName     string
	WorkflowRunID int64
	JobID         string
	// Run is the shell script the stand-in runner runs as the job's single step (sh -c, in its
	// workspace); empty means the job just succeeds. Only the stand-in protocol carries it.
	Run string
}

type job struct {
	id         int64
	scaleSetID int
	spec       JobSpec
	attempt    int // the attempt of its workflow run it belongs to
	state      JobState
	runnerID   int
	runnerName string
	result     string
	log        string // what the stand-in runner reported
	queued     time.Time
	assigned   time.Time
	started    time.Time
	finished   time.Time
}

// Job is a snapshot of one job.
type Job struct {
	ID         int64 // the runner request id of its messages
	ScaleSetID int
	Labels     []string
	State      JobState
	RunnerID   int
	RunnerName string
	Result     string
	// RunID is its workflow run; Attempt the run's attempt it belongs to (1, then one more
	// per rerun).
	RunID   int64
	Attempt int
}

// Job returns a snapshot of job id.
func (s *Server) Job(id int64) (Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return Job{}, fmt.Errorf("githubtest: job %d: %w", id, ErrUnknownJob)
	}
	return j.snapshot(), nil
}

func (j *job) snapshot() Job {
	return Job{ID: j.id, ScaleSetID: j.scaleSetID, Labels: slices.Clone(j.spec.Labels), State: j.state, RunnerID: j.runnerID,
		RunnerName: j.runnerName, Result: j.result, RunID: j.spec.WorkflowRunID, Attempt: j.attempt}
}

// QueueJob queues a job for spec.Labels in the first scale set that carries all of them and
// sends it a JobAvailable message. It returns the job's runner request id. The job belongs to
// the current attempt of its workflow run (spec.WorkflowRunID), which is made for it if the fake
// does not know it; a run belongs to one repository.
func (s *Server) QueueJob(spec JobSpec) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queueLocked(spec)
}

// queueLocked is QueueJob; s.mu must be held.
func (s *Server) queueLocked(spec JobSpec) (int64, error) {
	var target *scaleSet
	for id := 1; id < s.nextSetID && target == nil; id++ {
		if set, ok := s.scaleSets[id]; ok && set.hasLabels(spec.Labels) {
			target = set
		}
	}
	if len(spec.Labels) == 0 || target == nil {
		return 0, fmt.Errorf("githubtest: queue job for %v: %w; create one with those labels first", spec.Labels, ErrNoScaleSet)
	}
	if spec.Owner == "" {
		spec.Owner = "octo"
	}
	if spec.Repository == "" {
		spec.Repository = "hello"
	}
	if spec.EventName == "" {
		spec.EventName = "push"
	}
	spec.Labels = slices.Clone(spec.Labels)
	if spec.WorkflowRunID == 0 {
		spec.WorkflowRunID = 1000 + s.nextJob
	}
	run, err := s.runLocked(spec)
	if err != nil {
		return 0, err
	}
	j := &job{id: s.nextJob, scaleSetID: target.id, spec: spec, attempt: run.attempt, state: JobQueued, queued: time.Now().UTC()}
	s.nextJob++
	if j.spec.DisplayName == "" {
		j.spec.DisplayName = "job-" + strconv.FormatInt(j.id, 10)
	}
	if j.spec.WorkflowRef == "" {
		j.spec.WorkflowRef = j.spec.Owner + "/" + j.spec.Repository + "/.github/workflows/ci.yml@refs/heads/main"
	}
	if j.spec.JobID == "" {
		j.spec.JobID = uuid.NewString()
	}
	s.jobs[j.id] = j
	jm := s.jobMessage(j, jobAvailable)
	jm.AcquireJobURL = fmt.Sprintf("%s_apis/runtime/runnerscalesets/%d/acquirejobs", s.ActionsServiceURL(), target.id)
	s.enqueueLocked(target.id, jm)
	return j.id, nil
}

func (s *Server) jobMessage(j *job, typ string) wireJobMessage {
	return wireJobMessage{
		MessageType:        typ,
		RunnerRequestID:    j.id,
		RepositoryName:     j.spec.Repository,
		OwnerName:          j.spec.Owner,
		JobID:              j.spec.JobID,
		JobWorkflowRef:     j.spec.WorkflowRef,
		JobDisplayName:     j.spec.DisplayName,
		WorkflowRunID:      j.spec.WorkflowRunID,
		EventName:          j.spec.EventName,
		RequestLabels:      j.spec.Labels,
		QueueTime:          j.queued,
		ScaleSetAssignTime: j.assigned,
		RunnerAssignTime:   j.started,
		FinishTime:         j.finished,
		RunnerID:           j.runnerID,
		RunnerName:         j.runnerName,
		Result:             j.result,
	}
}

// jobLocked finds job id in state want; s.mu must be held.
func (s *Server) jobLocked(id int64, want ...JobState) (*job, error) {
	j, ok := s.jobs[id]
	if !ok {
		return nil, fmt.Errorf("githubtest: job %d: %w", id, ErrUnknownJob)
	}
	for _, st := range want {
		if j.state == st {
			return j, nil
		}
	}
	return nil, fmt.Errorf("githubtest: job %d is %s, not %v: %w", id, j.state, want, ErrJobState)
}

// AssignJob assigns job id to its scale set and sends JobAssigned: an acquired one, as GitHub
// does after acquisition, or a queued one, as github.com does without waiting for the
// listener to acquire it.
func (s *Server) AssignJob(id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.jobLocked(id, JobQueued, JobAcquired)
	if err != nil {
		return err
	}
	s.assignLocked(j)
	return nil
}

func (s *Server) assignLocked(j *job) {
	j.state = JobAssigned
	j.assigned = time.Now().UTC()
	s.enqueueLocked(j.scaleSetID, s.jobMessage(j, jobAssigned))
}

// StartJob starts assigned job id on a runner of its scale set and sends JobStarted, as the
// runner does when it picks the job up. runnerID 0 lets the fake choose, as GitHub does: the
// oldest idle runner. It returns the runner's id.
func (s *Server) StartJob(id int64, runnerID int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.jobLocked(id, JobAssigned)
	if err != nil {
		return 0, err
	}
	var rn *runner
	if runnerID != 0 {
		if r, ok := s.runners[runnerID]; ok && r.scaleSetID == j.scaleSetID && r.jobID == 0 {
			rn = r
		}
	} else {
		for rid := 1; rid < s.nextRunner && rn == nil; rid++ {
			if r, ok := s.runners[rid]; ok && r.scaleSetID == j.scaleSetID && r.jobID == 0 {
				rn = r
			}
		}
	}
	if rn == nil {
		return 0, fmt.Errorf("githubtest: start job %d on runner %d: %w; generate a JIT config first", id, runnerID, ErrNoIdleRunner)
	}
	s.startLocked(j, rn)
	return rn.id, nil
}

// startLocked starts assigned job j on idle runner rn and sends JobStarted; s.mu must be held.
func (s *Server) startLocked(j *job, rn *runner) {
	rn.jobID = j.id
	j.state, j.runnerID, j.runnerName, j.started = JobRunning, rn.id, rn.name, time.Now().UTC()
	s.enqueueLocked(j.scaleSetID, s.jobMessage(j, jobStarted))
}

// CompleteJob finishes job id with result ("succeeded", "failed", "canceled") and sends
// JobCompleted. A running job's runner, single-use, is removed; a job that never started
// completes without a runner, as a cancelled one does.
func (s *Server) CompleteJob(id int64, result string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.jobLocked(id, JobQueued, JobAcquired, JobAssigned, JobRunning)
	if err != nil {
		return err
	}
	s.completeLocked(j, result)
	return nil
}

// completeLocked finishes job j with result and sends JobCompleted; the runner of a running job
// is retired: gone from the runners, remembered so that it is told it has run; s.mu must be held.
func (s *Server) completeLocked(j *job, result string) {
	if j.state == JobRunning {
		if rn, ok := s.runners[j.runnerID]; ok {
			delete(s.runners, rn.id)
			s.retired[rn.id] = rn
		}
	}
	j.state, j.result, j.finished = JobCompleted, result, time.Now().UTC()
	s.enqueueLocked(j.scaleSetID, s.jobMessage(j, jobCompleted))
}

// JobLog returns the log the stand-in runner reported for job id; empty until it reports.
func (s *Server) JobLog(id int64) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return "", fmt.Errorf("githubtest: job %d: %w", id, ErrUnknownJob)
	}
	return j.log, nil
}

// handleAcquireJobs is POST .../{id}/acquirejobs with a JSON array of runner request ids,
// authorised by the scale set's session token. It answers the ids it acquired.
func (s *Server) handleAcquireJobs(w http.ResponseWriter, r *http.Request) {
	var ids []int64
	if err := json.NewDecoder(r.Body).Decode(&ids); err != nil {
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: body must be a JSON array of runner request ids: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tok, _ := bearer(r, "Bearer")
	authorised := false
	for _, sess := range s.sessions {
		if strconv.Itoa(sess.scaleSetID) == r.PathValue("id") && sess.tokenValid && sess.token == tok {
			authorised = true
		}
	}
	if !authorised {
		s.counts.RejectedAuth++
		writeException(w, http.StatusUnauthorized, "TaskAgentSessionExpiredException", "githubtest: acquirejobs needs the scale set's current message-queue token; refresh the session")
		return
	}
	set, ok := s.scaleSetFromPath(w, r)
	if !ok {
		return
	}
	out := wireAcquired{Value: []int64{}}
	for _, id := range ids {
		j, ok := s.jobs[id]
		if !ok || j.scaleSetID != set.id || j.state != JobQueued {
			continue
		}
		j.state = JobAcquired
		out.Value = append(out.Value, id)
		if s.opts.AssignOnAcquire {
			s.assignLocked(j)
		}
	}
	out.Count = len(out.Value)
	writeJSON(w, http.StatusOK, out)
}
