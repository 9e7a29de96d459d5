package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// Read reads the fleet over js, with read access only: the heartbeats in
// eventlog.BucketComponents and the last record of every assignment eventlog.BucketLive
// indexes. A bucket that does not exist (no component ever started) reads as empty.
func Read(ctx context.Context, js jetstream.JetStream, now func() time.Time) (Report, error) {
	records, rejected, err := ReadComponents(ctx, js)
	if err != nil {
		return Report{}, err
	}
	states, err := ReadLive(ctx, js)
	if err != nil {
		return Report{}, err
	}
	r := Build(records, states, now().UTC())
	r.Rejected = rejected
	return r, nil
}

// ReadComponents returns the heartbeats in eventlog.BucketComponents, and how many of its
// values were not heartbeats (liveness.ErrInvalid; skipped).
func ReadComponents(ctx context.Context, js jetstream.JetStream) ([]liveness.Record, int, error) {
	entries, err := readBucket(ctx, js, eventlog.BucketComponents)
	if err != nil {
		return nil, 0, err
	}
	var out []liveness.Record
	rejected := 0
	for _, e := range entries {
		r, err := liveness.Parse(e.Key(), e.Value())
		if err != nil {
			rejected++
			continue
		}
		out = append(out, r)
	}
	return out, rejected, nil
}

// ReadLive returns the state of every assignment eventlog.BucketLive indexes, from its last
// record. An index key whose assignment has no record, or one that does not decode, is
// skipped: the index lags or leads the stream by moments, and the views repair it.
func ReadLive(ctx context.Context, js jetstream.JetStream) ([]assignment.State, error) {
	entries, err := readBucket(ctx, js, eventlog.BucketLive)
	if err != nil || len(entries) == 0 {
		return nil, err
	}
	stream, err := js.Stream(ctx, eventlog.StreamAssignments)
	if err != nil {
		return nil, fmt.Errorf("fleet: stream %s: %w", eventlog.StreamAssignments, err)
	}
	var out []assignment.State
	for _, e := range entries {
		task, ok := eventlog.ParseLiveKey(e.Key())
		if !ok {
			continue
		}
		msg, err := stream.GetLastMsgForSubject(ctx, eventlog.Subject(task))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("fleet: read task %d: %w", task, err)
		}
		var rec assignment.Record
		if json.Unmarshal(msg.Data, &rec) != nil || rec.Task != task {
			continue
		}
		out = append(out, assignment.State{Record: rec, Seq: msg.Sequence})
	}
	return out, nil
}

// readBucket returns the current values of a bucket's keys, deleted ones left out; none when
// the bucket does not exist.
func readBucket(ctx context.Context, js jetstream.JetStream, bucket string) ([]jetstream.KeyValueEntry, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fleet: bucket %s: %w", bucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("fleet: read bucket %s: %w", bucket, err)
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case e := <-w.Updates():
			if e == nil { // every value present when the watch began
				return out, nil
			}
			out = append(out, e)
		case <-ctx.Done():
			return nil, fmt.Errorf("fleet: read bucket %s: %w", bucket, ctx.Err())
		}
	}
}
