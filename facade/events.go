package facade

import (
	"context"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

// EventLog is what the Facade uses of the event log: the assignments environments report on
// and their sealed tasks. *eventlog.Log is one.
type EventLog interface {
	Get(ctx context.Context, task assignment.TaskID) (assignment.State, error)
	Apply(ctx context.Context, ev assignment.Event, hint *assignment.State) (assignment.State, error)
	GetTask(ctx context.Context, task assignment.TaskID) ([]byte, error)
}

// View is what the Facade uses of the read model of the assignments. *eventlog.View is one.
type View interface {
	Get(task assignment.TaskID) (assignment.State, bool)
	Observe(s assignment.State)
}

var (
	_ EventLog = (*eventlog.Log)(nil)
	_ View     = (*eventlog.View)(nil)
)
