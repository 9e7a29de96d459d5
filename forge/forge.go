package forge

import (
	"context"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
)

// Forge is the upstream RunnerService as the scheduler and the facade use it, already
// authenticated as the resident runner.
type Forge interface {
	FetchTask(ctx context.Context, tasksVersion int64) (*runnerv1.FetchTaskResponse, error)
	UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error)
	UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error)
}
