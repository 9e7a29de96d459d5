package scheduler

import (
	"context"
	"iter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

// EventLog is what the Scheduler uses of the event log: the assignments it claims and ends,
// their sealed tasks, the dispatch queue and the replicas' leases (eventlog.BucketLeases, whose
// TTL is Config().LeasesTTL). *eventlog.Log is one.
type EventLog interface {
	Config() eventlog.Config
	Leases() jetstream.KeyValue
	Get(ctx context.Context, task assignment.TaskID) (assignment.State, error)
	Apply(ctx context.Context, ev assignment.Event, hint *assignment.State) (assignment.State, error)
	Dispatch(ctx context.Context, backend assignment.Backend, task assignment.TaskID, epoch assignment.Epoch) error
	PutTask(ctx context.Context, task assignment.TaskID, sealed []byte) error
	DropTask(ctx context.Context, task assignment.TaskID) error
	// Sweep removes what ended assignments left behind (eventlog.Log.Sweep).
	Sweep(ctx context.Context) (int, error)
}

// View is what the Scheduler uses of the read model of the assignments. *eventlog.View is
// one.
type View interface {
	Ready() <-chan struct{}
	Get(task assignment.TaskID) (assignment.State, bool)
	Live() []assignment.State
	// LiveStates yields the live states under the view's read lock: the loop's body must not
	// block or call the view.
	LiveStates() iter.Seq[assignment.State]
	LiveTasks() []assignment.TaskID
	Ended() []assignment.State
	Forget(cutoff time.Time) []assignment.TaskID
	Observe(s assignment.State)
}

var (
	_ EventLog = (*eventlog.Log)(nil)
	_ View     = (*eventlog.View)(nil)
)
