package podworker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketWorkers holds one key per running worker: put when it starts and at every heartbeat,
// deleted when it shuts down cleanly, expired three heartbeats after the last one otherwise.
// A worker adopts another worker's environment only once that worker's key is gone.
const BucketWorkers = "dynrunner_workers"

// DefaultHeartbeat is how often a worker refreshes its key unless Config.Heartbeat says
// otherwise.
const DefaultHeartbeat = 10 * time.Second

// heartbeatsPerTTL is how many heartbeats a key outlives: a worker is declared gone after
// missing this many in a row.
const heartbeatsPerTTL = 3

// openWorkers ensures the liveness bucket.
func openWorkers(ctx context.Context, js jetstream.JetStream, replicas int, ttl time.Duration) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketWorkers,
		Description: "dynrunner pod and vm workers that are alive, keyed by their actor (base64url)",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("podworker: bucket %s: %w", BucketWorkers, err)
	}
	return kv, nil
}

// workerKey is an actor's key in BucketWorkers. Actors hold characters keys may not
// ("pod-worker@host/pid"); base64url yields only ones they may.
func workerKey(actor string) string { return base64.RawURLEncoding.EncodeToString([]byte(actor)) }

// ttl is how long a worker's key outlives its last heartbeat.
func (w *Worker) ttl() time.Duration { return heartbeatsPerTTL * w.cfg.Heartbeat }

// beat puts the worker's key; its value is the actor, for operators.
func (w *Worker) beat(ctx context.Context) error {
	if _, err := w.workers.Put(ctx, workerKey(w.cfg.Actor), []byte(w.cfg.Actor)); err != nil {
		return fmt.Errorf("podworker: heartbeat: %w", err)
	}
	return nil
}

func (w *Worker) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.beat(ctx); err != nil && ctx.Err() == nil {
				w.cfg.Log.Warn().Err(err).Msg("heartbeat")
			}
		}
	}
}

// leave deletes the worker's key, so other workers adopt its environments at their next sweep
// instead of after the key expired.
func (w *Worker) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.workers.Delete(ctx, workerKey(w.cfg.Actor)); err != nil {
		w.cfg.Log.Warn().Err(err).Dur("expires_in", w.ttl()).Msg("delete the liveness key; it expires by itself")
	}
}

// watchedElsewhere reports whether starter, the worker that recorded an environment's
// `started`, is another worker that is alive, and when its key expires unless refreshed. An
// environment without a recorded starter (started by an older release) counts as orphaned.
func (w *Worker) watchedElsewhere(ctx context.Context, starter string) (bool, time.Time, error) {
	if starter == "" || starter == w.cfg.Actor {
		return false, time.Time{}, nil
	}
	e, err := w.workers.Get(ctx, workerKey(starter))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, time.Time{}, nil
	}
	if err != nil {
		return false, time.Time{}, fmt.Errorf("podworker: liveness of %s: %w", starter, err)
	}
	return true, e.Created().Add(w.ttl()), nil
}
