package podworker

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

// EventLog is what a Worker uses of the event log: its assignments, its tier's dispatch
// queue and the liveness bucket. *eventlog.Log is one.
type EventLog interface {
	Config() eventlog.Config
	Get(ctx context.Context, task assignment.TaskID) (assignment.State, error)
	Apply(ctx context.Context, ev assignment.Event, hint *assignment.State) (assignment.State, error)
	Consumer(ctx context.Context, backend assignment.Backend) (jetstream.Consumer, error)
	ParseDispatch(msg jetstream.Msg) (eventlog.DispatchMsg, error)
	DeadLetter(ctx context.Context, backend assignment.Backend, data []byte, reason string) error
	// GetTask reads a GitHub slot's sealed JIT configuration.
	GetTask(ctx context.Context, task assignment.TaskID) ([]byte, error)
	// Workers is eventlog.BucketWorkers; its keys expire Config().WorkersTTL after their last put.
	Workers() jetstream.KeyValue
	// WriteWorkers makes compare-and-swap writes to Workers() pipelined: the heartbeat's
	// renewals and the deletes of a worker that leaves.
	WriteWorkers(ctx context.Context, ws []eventlog.KeyWrite) (revs []uint64, errs []error)
}

// View is what a Worker uses of the read model of the assignments. *eventlog.View is one;
// New subscribes to it (OnChange), so a Worker is built before the view is fed.
type View interface {
	OnChange(fn func(assignment.State))
	Ready() <-chan struct{}
	Get(task assignment.TaskID) (assignment.State, bool)
	Observe(s assignment.State)
}

var (
	_ EventLog = (*eventlog.Log)(nil)
	_ View     = (*eventlog.View)(nil)
)
