package eventlog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// The live index (BucketLive) lets a starting view load the live assignments without reading
// the history: one key per live assignment, and the stream sequence through which the index
// is known to be complete.
//
// Apply keeps it: after a claim it puts the task's key (its value the claim's sequence, the
// epoch), after the append that ends the assignment it purges the key; the transitions between
// leave it alone, so the index costs two writes per assignment. A crash between the append
// and the key's update loses nothing: every view, while it follows the stream, makes sure each
// live assignment it sees has its key (creating what is missing; a claim this process indexed
// itself needs no check), then moves liveTailKey forward to the last record it saw; a starting
// view reads the records after liveTailKey before it trusts the keys. Keys of assignments that
// ended are removed by a starting view and by Sweep; such a key only costs one read at the
// next start.
const (
	liveTaskPrefix = "task."
	liveTailKey    = "tail"
)

// livePurgeTTL is how long the marker a purged key leaves in BucketLive stays, where the
// server supports per-message TTLs (NATS 2.11 and later): without it every assignment that
// ever ended would leave a marker the start lists.
const livePurgeTTL = time.Minute

// livePassEvery is how often a view that follows the stream checks the keys of the live
// assignments it saw and moves the index's tail forward.
var livePassEvery = 30 * time.Second

func liveKey(task assignment.TaskID) string { return liveTaskPrefix + task.String() }

// ParseLiveKey returns the task a key of BucketLive indexes, and false for its other keys
// (the tail): what a reader of the index that holds no Log (`dynrunner status`) needs.
func ParseLiveKey(key string) (assignment.TaskID, bool) { return parseLiveKey(key) }

func parseLiveKey(key string) (assignment.TaskID, bool) {
	rest, ok := strings.CutPrefix(key, liveTaskPrefix)
	if !ok {
		return 0, false
	}
	task, err := assignment.ParseTaskID(rest)
	return task, err == nil
}

// ensureLiveBucket ensures BucketLive: one value per key, no TTL of its own, and (where the
// server supports it) markers that expire.
func ensureLiveBucket(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.KeyValue, bool, error) {
	want := jetstream.KeyValueConfig{
		Bucket:         BucketLive,
		Description:    "dynrunner live assignments: task.<task_id> per live assignment, tail: the stream sequence the index is complete through",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       cfg.Replicas,
		LimitMarkerTTL: livePurgeTTL,
	}
	kv, err := ensureKeyValue(ctx, js, want)
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		want.LimitMarkerTTL = 0
		kv, err = ensureKeyValue(ctx, js, want)
	}
	if err != nil {
		return nil, false, fmt.Errorf("eventlog: bucket %s: %w", BucketLive, err)
	}
	ttl := false
	if st, err := kv.Status(ctx); err == nil {
		if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			ttl = s.StreamInfo().Config.AllowMsgTTL
		}
	}
	return kv, ttl, nil
}

// Live returns BucketLive, the index of the live assignments.
func (l *Log) Live() jetstream.KeyValue { return l.live }

// index updates the live index after the append of st: a claim puts the task's key, an end
// purges it. An error is not the append's: the append stands, and the views repair the index
// (see BucketLive).
func (l *Log) index(ctx context.Context, st assignment.State) error {
	switch {
	case st.Transition == assignment.Claimed:
		if _, err := l.live.Put(ctx, liveKey(st.Task), []byte(strconv.FormatUint(st.Seq, 10))); err != nil {
			return fmt.Errorf("eventlog: add task %d to the live index: %w", st.Task, err)
		}
		l.keyed.add(st.Task)
	case !st.Live():
		return l.unindex(ctx, st.Task)
	}
	return nil
}

// keyedSet remembers the claims this process put into the live index, so its view need not
// check their keys; bounded, it stops remembering when full (the view then checks).
type keyedSet struct {
	mu  sync.Mutex
	set map[assignment.TaskID]struct{}
}

const maxKeyed = 1 << 16

func (k *keyedSet) add(task assignment.TaskID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.set == nil {
		k.set = make(map[assignment.TaskID]struct{})
	}
	if len(k.set) < maxKeyed {
		k.set[task] = struct{}{}
	}
}

// take reports whether task was remembered, and forgets it.
func (k *keyedSet) take(task assignment.TaskID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.set[task]
	delete(k.set, task)
	return ok
}

// unindex purges a task's key from the live index.
func (l *Log) unindex(ctx context.Context, task assignment.TaskID) error {
	var opts []jetstream.KVDeleteOpt
	if l.liveTTL {
		opts = append(opts, jetstream.PurgeTTL(livePurgeTTL))
	}
	if err := l.live.Purge(ctx, liveKey(task), opts...); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("eventlog: remove task %d from the live index: %w", task, err)
	}
	return nil
}

// liveKeysTimeout bounds the listing of the live index: the listing is a watch that ends when
// its initial values have come, and a watch that never gets them (a bucket whose replicas were
// just cut off) would hold a starting view unready for good. Past it the listing fails with
// context.DeadlineExceeded, and the controller's Watch starts again (watchEventLog).
const liveKeysTimeout = 30 * time.Second

// liveKeys lists the tasks the live index has keys for.
func (l *Log) liveKeys(ctx context.Context) (map[assignment.TaskID]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, liveKeysTimeout)
	defer cancel()
	lister, err := l.live.ListKeysFiltered(ctx, liveTaskPrefix+">")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return map[assignment.TaskID]bool{}, nil
		}
		return nil, fmt.Errorf("eventlog: list the live index: %w", err)
	}
	defer func() { _ = lister.Stop() }()
	keys := map[assignment.TaskID]bool{}
	for k := range lister.Keys() {
		if task, ok := parseLiveKey(k); ok {
			keys[task] = true
		}
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("eventlog: list the live index: %w", ctx.Err())
	}
	return keys, nil
}

// liveTail reads the stream sequence through which the live index is complete, and the key's
// revision (0 when it has none: the index was never completed, so the whole stream is read).
func (l *Log) liveTail(ctx context.Context) (seq, rev uint64, err error) {
	e, err := l.live.Get(ctx, liveTailKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("eventlog: read the live index's tail: %w", err)
	}
	seq, perr := strconv.ParseUint(string(e.Value()), 10, 64)
	if perr != nil {
		seq = 0 // not ours: read the whole stream once, and replace it
	}
	return seq, e.Revision(), nil
}

// advanceTail moves the live index's tail to seq unless it is there or further already.
func (l *Log) advanceTail(ctx context.Context, seq uint64) error {
	for range 4 {
		cur, rev, err := l.liveTail(ctx)
		if err != nil {
			return err
		}
		if cur >= seq && rev != 0 {
			return nil
		}
		val := []byte(strconv.FormatUint(seq, 10))
		if rev == 0 {
			_, err = l.live.Create(ctx, liveTailKey, val)
		} else {
			_, err = l.live.Update(ctx, liveTailKey, val, rev)
		}
		if err == nil || !isKVConflict(err) {
			if err != nil {
				return fmt.Errorf("eventlog: move the live index's tail to %d: %w", seq, err)
			}
			return nil
		}
	}
	return nil // others keep moving it; the next pass tries again
}

func isKVConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || isConflict(err)
}

// ensureIndexed creates the key of a live task the index lacks (a crash came between its
// claim and the key's put). A key that exists is left alone.
func (l *Log) ensureIndexed(ctx context.Context, st assignment.State) error {
	_, err := l.live.Get(ctx, liveKey(st.Task))
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("eventlog: read task %d in the live index: %w", st.Task, err)
	}
	_, err = l.live.Create(ctx, liveKey(st.Task), []byte(strconv.FormatUint(uint64(st.Epoch()), 10)))
	if err != nil && !isKVConflict(err) {
		return fmt.Errorf("eventlog: add task %d to the live index: %w", st.Task, err)
	}
	return nil
}

// Sweep removes what the assignments that ended left behind: their keys in the live index
// (an end whose key removal was lost, or a key put again by an append that raced the end),
// and their sealed tasks (DropTask), each after reading the assignment from JetStream. A
// sealed task whose assignment does not exist is left alone: the scheduler stores it before
// the claim. It returns how many keys and tasks it removed.
func (l *Log) Sweep(ctx context.Context) (int, error) {
	n := 0
	keys, err := l.liveKeys(ctx)
	if err != nil {
		return n, err
	}
	var errs []error
	for task := range keys {
		st, err := l.Get(ctx, task)
		if err == nil && st.Live() {
			continue
		}
		if err != nil && !errors.Is(err, assignment.ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		if err := l.unindex(ctx, task); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	lister, err := l.tasks.ListKeys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return n, errors.Join(append(errs, fmt.Errorf("eventlog: list the sealed tasks: %w", err))...)
	}
	if err == nil {
		var sealed []assignment.TaskID
		for k := range lister.Keys() {
			_, rest, _ := strings.Cut(k, ".")
			if task, err := assignment.ParseTaskID(rest); err == nil && taskKey(task) == k {
				sealed = append(sealed, task)
			}
		}
		_ = lister.Stop()
		for _, task := range sealed {
			st, err := l.Get(ctx, task)
			if err != nil || st.Live() {
				continue
			}
			if err := l.DropTask(ctx, task); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}
