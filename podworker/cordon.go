package podworker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// FollowCordon keeps the worker draining while its cordon exists in cordons
// (eventlog.BucketCordons) under key, its heartbeat key (liveness.Record.Key), or while
// stopping reports true (the process stops with DRAIN_SECS: lifting the cordon does not undo
// that). It reads the cordon every interval until ctx ends, and returns nil then. A read that
// fails keeps the state the worker had.
func (w *Worker) FollowCordon(ctx context.Context, cordons jetstream.KeyValue, key string, every time.Duration, stopping func() bool) error {
	logger := w.cfg.Log.With().Str("worker", key).Logger()
	for {
		_, err := liveness.GetCordon(ctx, cordons, key)
		switch {
		case err == nil:
			w.SetDraining(true)
		case errors.Is(err, liveness.ErrNoCordon):
			w.SetDraining(stopping())
		case ctx.Err() == nil:
			logger.Warn().Err(err).Msg("read the worker's cordon; keeping its drain state")
		}
		if clock.Sleep(ctx, every) != nil {
			return nil //nolint:nilerr // the worker stops: no failure
		}
	}
}
