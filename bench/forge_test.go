package bench

import (
	"context"
	"sync"
	"sync/atomic"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/dynrunner/dynrunner/forge"
)

// benchPayload is the workflow payload Gitea sends for a one-step job, `runs-on` already
// evaluated.
const benchPayload = `name: bench
on: [push]
jobs:
  hi:
    name: hi
    runs-on: [self-hosted, pod]
    steps:
      - run: echo hi
`

// fakeForge is the upstream RunnerService in memory. FetchTask hands out tasks numbered from 1
// up to a limit the benchmark raises; UpdateTask and UpdateLog only count. It keeps no
// per-task state, so what the memory benchmark measures is the controller's.
type fakeForge struct {
	ctx     *structpb.Struct
	secrets map[string]string

	mu          sync.Mutex
	next, limit int64

	updates, logs, successes atomic.Int64
}

var _ forge.Forge = (*fakeForge)(nil)

func newFakeForge() *fakeForge {
	// Every task shares one context and secrets map; the scheduler only reads them.
	ctx, err := structpb.NewStruct(map[string]any{
		"repository": "bench/repo", "ref": "refs/heads/main", "sha": "0123456789abcdef0123456789abcdef01234567",
		"event_name": "push", "token": "ghs_benchmark_token_not_a_secret",
	})
	if err != nil {
		panic(err)
	}
	return &fakeForge{ctx: ctx, secrets: map[string]string{"API_KEY": "benchmark"}}
}

// release makes n more tasks available to FetchTask.
func (f *fakeForge) release(n int) {
	f.mu.Lock()
	f.limit += int64(n)
	f.mu.Unlock()
}

func (f *fakeForge) FetchTask(_ context.Context, v int64) (*runnerv1.FetchTaskResponse, error) {
	f.mu.Lock()
	if f.next >= f.limit {
		f.mu.Unlock()
		return &runnerv1.FetchTaskResponse{TasksVersion: v}, nil
	}
	f.next++
	id := f.next
	f.mu.Unlock()
	return &runnerv1.FetchTaskResponse{TasksVersion: v + 1, Task: &runnerv1.Task{
		Id: id, WorkflowPayload: []byte(benchPayload), Context: f.ctx, Secrets: f.secrets,
	}}, nil
}

func (f *fakeForge) UpdateTask(_ context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	f.updates.Add(1)
	if req.GetState().GetResult() == runnerv1.Result_RESULT_SUCCESS {
		f.successes.Add(1)
	}
	return &runnerv1.UpdateTaskResponse{State: &runnerv1.TaskState{Id: req.GetState().GetId()}}, nil
}

func (f *fakeForge) UpdateLog(_ context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	f.logs.Add(1)
	return &runnerv1.UpdateLogResponse{AckIndex: req.GetIndex() + int64(len(req.GetRows()))}, nil
}
