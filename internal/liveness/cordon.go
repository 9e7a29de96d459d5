package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Cordon is a worker's cordon in the cordons bucket (eventlog.BucketCordons), keyed by the
// worker's instance: while it exists the worker takes no new environment and finishes the ones
// it has (it drains). It holds until lifted (Uncordon), a restart of the worker included.
type Cordon struct {
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// ErrNoCordon: the worker is not cordoned.
var ErrNoCordon = errors.New("liveness: worker not cordoned")

// PutCordon cordons the worker instance.
func PutCordon(ctx context.Context, kv jetstream.KeyValue, instance string, c Cordon) error {
	if !keyChars.MatchString(instance) {
		return fmt.Errorf("%w: instance %q is not a key", ErrInvalid, instance)
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, instance, b); err != nil {
		return fmt.Errorf("liveness: cordon %s: %w", instance, err)
	}
	return nil
}

// DeleteCordon lifts the cordon of the worker instance; lifting none is no error.
func DeleteCordon(ctx context.Context, kv jetstream.KeyValue, instance string) error {
	if !keyChars.MatchString(instance) {
		return fmt.Errorf("%w: instance %q is not a key", ErrInvalid, instance)
	}
	if err := kv.Delete(ctx, instance); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("liveness: lift the cordon of %s: %w", instance, err)
	}
	return nil
}

// GetCordon reads the cordon of the worker instance: ErrNoCordon when it has none. A value
// that does not decode counts as a cordon (fail closed: the worker takes nothing new).
func GetCordon(ctx context.Context, kv jetstream.KeyValue, instance string) (Cordon, error) {
	if !keyChars.MatchString(instance) {
		return Cordon{}, fmt.Errorf("%w: instance %q is not a key", ErrInvalid, instance)
	}
	e, err := kv.Get(ctx, instance)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Cordon{}, ErrNoCordon
	}
	if err != nil {
		return Cordon{}, fmt.Errorf("liveness: read the cordon of %s: %w", instance, err)
	}
	var c Cordon
	if json.Unmarshal(e.Value(), &c) != nil {
		c = Cordon{By: "unknown (undecodable cordon)", At: e.Created()}
	}
	return c, nil
}
