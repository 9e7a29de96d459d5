package forgetest

import (
	"context"
	"sync"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/dynrunner/dynrunner/forge"
)

// Forge is an in-memory upstream RunnerService: it hands out queued tasks and records what the
// scheduler and the facade report.
type Forge struct {
	mu      sync.Mutex
	queue   []*runnerv1.Task
	states  map[int64][]*runnerv1.TaskState
	logs    map[int64][]string
	noMore  map[int64]bool
	cancel  map[int64]bool
	fetches int
}

var _ forge.Forge = (*Forge)(nil)

// New returns a Forge with no tasks.
func New() *Forge {
	return &Forge{states: map[int64][]*runnerv1.TaskState{}, logs: map[int64][]string{}, noMore: map[int64]bool{}, cancel: map[int64]bool{}}
}

// Push queues t for FetchTask.
func (f *Forge) Push(t *runnerv1.Task) {
	f.mu.Lock()
	f.queue = append(f.queue, t)
	f.mu.Unlock()
}

// Cancel cancels task id in the forge: from now on UpdateTask answers that it was cancelled.
func (f *Forge) Cancel(id int64) {
	f.mu.Lock()
	f.cancel[id] = true
	f.mu.Unlock()
}

// FetchTask implements forge.Forge.
func (f *Forge) FetchTask(_ context.Context, v int64) (*runnerv1.FetchTaskResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fetches++
	if len(f.queue) == 0 {
		return &runnerv1.FetchTaskResponse{TasksVersion: v}, nil
	}
	t := f.queue[0]
	f.queue = f.queue[1:]
	return &runnerv1.FetchTaskResponse{Task: t, TasksVersion: v + 1}, nil
}

// Fetches is how many FetchTask calls the forge got.
func (f *Forge) Fetches() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fetches
}

// UpdateTask implements forge.Forge.
func (f *Forge) UpdateTask(_ context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := req.GetState().GetId()
	f.states[id] = append(f.states[id], req.GetState())
	st := &runnerv1.TaskState{Id: id}
	if f.cancel[id] {
		st.Result = runnerv1.Result_RESULT_CANCELLED
	}
	return &runnerv1.UpdateTaskResponse{State: st}, nil
}

// Reports is how many state reports the forge got for task id.
func (f *Forge) Reports(id int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.states[id])
}

// UpdateLog implements forge.Forge.
func (f *Forge) UpdateLog(_ context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := req.GetTaskId()
	ack := int64(len(f.logs[id]))
	if req.GetIndex() <= ack && int64(len(req.GetRows()))+req.GetIndex() > ack {
		for _, r := range req.GetRows()[ack-req.GetIndex():] {
			f.logs[id] = append(f.logs[id], r.GetContent())
		}
	}
	if req.GetNoMore() {
		f.noMore[id] = true
	}
	return &runnerv1.UpdateLogResponse{AckIndex: int64(len(f.logs[id]))}, nil
}

// Result is the first final result reported for task id, or RESULT_UNSPECIFIED.
func (f *Forge) Result(id int64) runnerv1.Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.states[id] {
		if s.GetResult() != runnerv1.Result_RESULT_UNSPECIFIED {
			return s.GetResult()
		}
	}
	return runnerv1.Result_RESULT_UNSPECIFIED
}

// Results is how many state reports with a final result the forge got for task id: once
// per report of the job's end.
func (f *Forge) Results(id int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.states[id] {
		if s.GetResult() != runnerv1.Result_RESULT_UNSPECIFIED {
			n++
		}
	}
	return n
}

// Log is the log rows the forge holds for task id.
func (f *Forge) Log(id int64) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.logs[id]...)
}

// Task returns a task of repository o/r whose job runs on [self-hosted, pod], with a secret
// (API_KEY=s3cr3t) and a runtime token (ghs_secret_token) in its context, so tests can look
// for them where they must not be.
func Task(id int64) *runnerv1.Task {
	ctx, _ := structpb.NewStruct(map[string]any{"repository": "o/r", "token": "ghs_secret_token"})
	return &runnerv1.Task{Id: id, Context: ctx, Secrets: map[string]string{"API_KEY": "s3cr3t"},
		WorkflowPayload: []byte("jobs:\n  build:\n    runs-on: [self-hosted, pod]\n")}
}
