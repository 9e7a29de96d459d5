package eventlog

import (
	"context"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// SetLivePassEvery makes following views check the live index every d, for a test.
func SetLivePassEvery(d time.Duration) (restore func()) {
	old := livePassEvery
	livePassEvery = d
	return func() { livePassEvery = old }
}

// LeaderGetTask is GetTask's read through the stream leader, which only a cluster needs.
func (l *Log) LeaderGetTask(ctx context.Context, task assignment.TaskID) ([]byte, error) {
	return l.leaderGetTask(ctx, task)
}
