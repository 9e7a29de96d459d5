package podworker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/logkey"
)

// The workers' keys in eventlog.BucketWorkers are of two kinds, each put again at every
// heartbeat and expired eventlog.Config.WorkersTTL (three heartbeats) after the last one:
//
//   - env.<task>.<epoch>: the actor of the worker that watches that environment. Created
//     (atomically: only if absent) by the worker that starts or adopts the environment,
//     deleted when it stops watching it. A worker adopts an environment only by creating its
//     key, so however many workers find it unwatched, one adopts it.
//   - the base64url of a worker's actor, its value the actor: which workers run, for operators
//     (nats kv ls). Deleted when the worker shuts down cleanly; nothing decides on it.

// heartbeatsPerTTL is how many heartbeats a key outlives: a worker is declared gone after
// missing this many in a row. The heartbeat is the bucket's TTL over it unless
// Config.Heartbeat says otherwise.
const heartbeatsPerTTL = 3

// workerKey is an actor's key in eventlog.BucketWorkers. Actors hold characters keys may not
// ("pod-worker@host/pid/instance", the instance a random hex suffix); base64url yields only
// ones they may, and never a dot, so a worker key is never an environment's.
func workerKey(actor string) string { return base64.RawURLEncoding.EncodeToString([]byte(actor)) }

// envKey is the key in eventlog.BucketWorkers naming the worker that watches an environment. A task
// has one assignment, so one backend: its key is the same in every tier.
func envKey(task assignment.TaskID, epoch assignment.Epoch) string {
	return fmt.Sprintf("env.%d.%d", task, epoch)
}

// ttl is how long a key outlives its last heartbeat: the bucket's TTL.
func (w *Worker) ttl() time.Duration { return w.log.Config().WorkersTTL }

// holder is what an environment's key says about who watches it.
type holder struct {
	// rev is the key's revision when this worker holds it, 0 when another worker does.
	rev uint64
	// actor is the worker that holds the key ("" when another worker created it just now).
	actor string
	// expires is when another worker's key expires unless that worker renews it.
	expires time.Time
}

// watcher reads an environment's key: who holds it (actor "" when none does) and when it
// expires unless renewed. It claims nothing.
func (w *Worker) watcher(ctx context.Context, key string) (holder, error) {
	e, err := w.workers.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return holder{}, nil
	}
	if err != nil {
		return holder{}, fmt.Errorf("podworker: watcher of %s: %w", key, err)
	}
	return holder{actor: string(e.Value()), expires: e.Created().Add(w.ttl())}, nil
}

// claim makes this worker the watcher of the environment key names, unless another worker is:
// it creates the key when it is absent (the environment is new, its watcher stopped cleanly,
// or crashed and the key expired; environments of releases before these keys have none) and
// renews it when it already holds this worker's actor. Create is atomic, so of the workers
// that find the key absent at once exactly one gets rev > 0. The create comes first, without
// a read: it is the common case (a new environment), and its own check refuses a key that
// exists; only then is the key read, to tell whose it is.
func (w *Worker) claim(ctx context.Context, key string) (holder, error) {
	rev, err := w.workers.Create(ctx, key, []byte(w.cfg.Actor))
	if err == nil {
		return holder{rev: rev, actor: w.cfg.Actor}, nil
	}
	if !eventlog.KeyTaken(err) {
		return holder{}, fmt.Errorf("podworker: claim %s: %w", key, err)
	}
	e, err := w.workers.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// Deleted between the create and the read: its watcher just let it go. Claim nothing
		// now, as when another worker created it just now; the next sweep decides.
		return holder{expires: w.cfg.Now().Add(w.ttl())}, nil
	}
	if err != nil {
		return holder{}, fmt.Errorf("podworker: watcher of %s: %w", key, err)
	}
	if actor := string(e.Value()); actor != w.cfg.Actor {
		return holder{actor: actor, expires: e.Created().Add(w.ttl())}, nil
	}
	// Written by this worker (a heartbeat that raced its answer, a restart with the same
	// actor): renew it at the revision read, so a worker that created it meanwhile wins.
	rev, err = w.workers.Update(ctx, key, []byte(w.cfg.Actor), e.Revision())
	if eventlog.KeyTaken(err) {
		return holder{expires: w.cfg.Now().Add(w.ttl())}, nil
	}
	if err != nil {
		return holder{}, fmt.Errorf("podworker: claim %s: %w", key, err)
	}
	return holder{rev: rev, actor: w.cfg.Actor}, nil
}

// beat puts the worker's key and renews the keys of the environments it watches.
func (w *Worker) beat(ctx context.Context) error {
	began := time.Now()
	_, err := w.workers.Put(ctx, workerKey(w.cfg.Actor), []byte(w.cfg.Actor))
	if err != nil {
		err = fmt.Errorf("podworker: heartbeat: %w", err)
	}
	watched, rerr := w.renew(ctx)
	w.cfg.Metrics.beat(w.cfg.Tier, time.Since(began), watched)
	return errors.Join(err, rerr)
}

// renew renews the key of every environment the worker watches, at the revision it last
// wrote, and returns how many it renewed. When that fails because the key changed, the worker
// was cut off from NATS for longer than the TTL (or its claim after `started` failed): it
// claims the key again, and if another worker adopted the environment meanwhile, stops
// watching it and leaves it to that worker.
func (w *Worker) renew(ctx context.Context) (int, error) {
	type watched struct {
		e    *env
		task assignment.TaskID
		rev  uint64
	}
	var ws []watched
	w.mu.Lock()
	for task, e := range w.envs {
		if e.key != "" { // not a reservation
			ws = append(ws, watched{e, task, e.rev})
		}
	}
	w.mu.Unlock()
	// One pipelined write for all keys: at 10,000 environments one by one they took seconds of
	// every heartbeat (BenchmarkWriteWorkers).
	var writes []eventlog.KeyWrite
	actor := []byte(w.cfg.Actor)
	for _, x := range ws {
		if x.rev > 0 {
			writes = append(writes, eventlog.KeyWrite{Key: x.e.key, Value: actor, Rev: x.rev})
		}
	}
	revs, werrs := w.log.WriteWorkers(ctx, writes)
	var errs []error
	j := 0
	for _, x := range ws {
		var rev uint64
		var err error = jetstream.ErrKeyRevisionMismatch // no key yet: claim it
		if x.rev > 0 {
			rev, err = revs[j], werrs[j]
			j++
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			if !w.watching(x.task, x.e) {
				continue // it ended meanwhile, and its key was deleted
			}
			var h holder
			if h, err = w.claim(ctx, x.e.key); err == nil && h.rev == 0 {
				w.cfg.Log.Warn().Int64(logkey.TaskID, int64(x.task)).Str(logkey.Env, x.e.h.ID).Str("watcher", h.actor).
					Msg("another worker adopted the environment while this one was cut off; no longer watching it")
				w.release(x.e)
				continue
			}
			rev = h.rev
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("podworker: renew %s: %w", x.e.key, err))
			continue
		}
		w.mu.Lock()
		if x.e.rev == x.rev {
			x.e.rev = rev
		}
		w.mu.Unlock()
	}
	return len(ws), joinFew(errs)
}

// joinFew joins the first maxKeyErrors of errs and counts the rest: a warning about the keys
// of many environments (NATS away) names a few instead of every one.
func joinFew(errs []error) error {
	if len(errs) > maxKeyErrors {
		errs = append(errs[:maxKeyErrors:maxKeyErrors], fmt.Errorf("and %d more keys", len(errs)-maxKeyErrors))
	}
	return errors.Join(errs...)
}

// maxKeyErrors is how many failed key writes joinFew names.
const maxKeyErrors = 3

// errReleased is the cause a watch is cancelled with when another worker holds its
// environment's key: it stops watching, and neither fails the assignment nor destroys the
// environment.
var errReleased = errors.New("podworker: the environment is watched by another worker")

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

// unclaim deletes an environment's key if it still is at the revision this worker wrote, or
// at a later one that still names this worker (a heartbeat's renewal in flight), so a key
// another worker holds is never removed. A key left behind expires by itself.
func (w *Worker) unclaim(ctx context.Context, key string, rev uint64) {
	if rev == 0 {
		return
	}
	err := w.workers.Delete(ctx, key, jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// A heartbeat renewed it meanwhile (its new revision not yet recorded), or another
		// worker holds it: delete it at its present revision only if it still names this one.
		e, gerr := w.workers.Get(ctx, key)
		if gerr != nil || string(e.Value()) != w.cfg.Actor {
			return
		}
		err = w.workers.Delete(ctx, key, jetstream.LastRevision(e.Revision()))
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return
		}
	}
	if err != nil {
		w.cfg.Log.Warn().Err(err).Str("key", key).Dur("expires_in", w.ttl()).Msg("delete an environment's key; it expires by itself")
	}
}

// leave deletes the keys of the environments the worker still watched and its own key, so
// other workers (or this one restarted, with a new actor) adopt the environments at their next
// sweep instead of after the keys expired.
func (w *Worker) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	w.mu.Lock()
	envs := w.envs
	w.envs = make(map[assignment.TaskID]*env)
	w.mu.Unlock()
	var deletes []eventlog.KeyWrite
	for _, e := range envs {
		if e.rev != 0 {
			deletes = append(deletes, eventlog.KeyWrite{Key: e.key, Rev: e.rev, Delete: true})
		}
	}
	_, werrs := w.log.WriteWorkers(ctx, deletes)
	var errs []error
	for _, err := range werrs {
		if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		w.cfg.Log.Warn().Err(joinFew(errs)).Int("keys", len(errs)).Dur("expires_in", w.ttl()).Msg("delete the keys of the environments this worker watched; they expire by themselves")
	}
	if err := w.workers.Delete(ctx, workerKey(w.cfg.Actor)); err != nil {
		w.cfg.Log.Warn().Err(err).Dur("expires_in", w.ttl()).Msg("delete the liveness key; it expires by itself")
	}
}
