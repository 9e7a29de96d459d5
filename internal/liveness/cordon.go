package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Cordon is a worker's cordon in the cordons bucket (eventlog.BucketCordons), keyed by the
// worker's heartbeat key (Record.Key, <kind>.<instance>): while it exists the worker takes no
// new environment and finishes the ones it has (it drains). It names one worker process: it
// holds until lifted (DeleteCordon); a restarted worker is a new one, not cordoned.
type Cordon struct {
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// ErrNoCordon: the worker is not cordoned.
var ErrNoCordon = errors.New("liveness: worker not cordoned")

// checkWorkerKey checks key is a worker's heartbeat key: <kind>.<instance> of a worker kind.
func checkWorkerKey(key string) error {
	kind, instance, ok := strings.Cut(key, ".")
	if !ok || (kind != KindPodWorker && kind != KindVMWorker) || !keyChars.MatchString(instance) {
		return fmt.Errorf("liveness: %q is not a worker's key (pod-worker.<instance> or vm-worker.<instance>)", key)
	}
	return nil
}

// PutCordon cordons the worker.
func PutCordon(ctx context.Context, kv jetstream.KeyValue, worker string, c Cordon) error {
	if err := checkWorkerKey(worker); err != nil {
		return err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, worker, b); err != nil {
		return fmt.Errorf("liveness: cordon %s: %w", worker, err)
	}
	return nil
}

// DeleteCordon lifts the cordon of the worker; lifting none is no error.
func DeleteCordon(ctx context.Context, kv jetstream.KeyValue, worker string) error {
	if err := checkWorkerKey(worker); err != nil {
		return err
	}
	if err := kv.Delete(ctx, worker); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("liveness: lift the cordon of %s: %w", worker, err)
	}
	return nil
}

// GetCordon reads the cordon of the worker: ErrNoCordon when it has none. A value
// that does not decode counts as a cordon (fail closed: the worker takes nothing new).
func GetCordon(ctx context.Context, kv jetstream.KeyValue, worker string) (Cordon, error) {
	if err := checkWorkerKey(worker); err != nil {
		return Cordon{}, err
	}
	e, err := kv.Get(ctx, worker)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Cordon{}, ErrNoCordon
	}
	if err != nil {
		return Cordon{}, fmt.Errorf("liveness: read the cordon of %s: %w", worker, err)
	}
	var c Cordon
	if json.Unmarshal(e.Value(), &c) != nil {
		c = Cordon{By: "unknown (undecodable cordon)", At: e.Created()}
	}
	return c, nil
}
