package eventlog

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// GenerateEnded writes the history of n ended assignments, tasks first to first+n-1, straight
// into the assignments stream: for each its claimed record and its completed one, authentic
// and in the format Apply writes, but published in bulk and without compare-and-swap. The
// ended assignments need no key in the live index, and get none. It is the generator of
// benchmarks and tests that need a long history (bench, BenchmarkRestartWithHistory); a
// running system has no use for it.
func (l *Log) GenerateEnded(ctx context.Context, first assignment.TaskID, n int, at time.Time) error {
	// Below the client's limit of outstanding asynchronous publishes (4,000 by default).
	const batch = 1024
	for start := 0; start < n; start += batch {
		size := min(batch, n-start)
		claims := make([]assignment.Record, size)
		acks := make([]jetstream.PubAckFuture, size)
		for i := range size {
			task := first + assignment.TaskID(start+i)
			rec, err := assignment.Decide(nil, assignment.Event{Transition: assignment.Claimed, Task: task, Actor: "generator", At: at,
				Backend: assignment.BackendPod, Repo: "bench/history", Job: "build", RunsOn: []string{"self-hosted", "pod"},
				ForgeURL: "https://gitea.example.com", TaskDigest: "c4232bd11fc0d33d7c7a4d8220a46c01de9d934fd4959e88bdb28077578cdce7",
				Lease: 5 * time.Minute, Pickup: 2 * time.Minute})
			if err != nil {
				return fmt.Errorf("eventlog: generate task %d: %w", task, err)
			}
			claims[i] = rec
			if acks[i], err = l.publishAsync(rec); err != nil {
				return err
			}
		}
		dones := make([]jetstream.PubAckFuture, size)
		for i, f := range acks {
			var seq uint64
			select {
			case ack := <-f.Ok():
				seq = ack.Sequence
			case err := <-f.Err():
				return fmt.Errorf("eventlog: generate task %d: %w", claims[i].Task, err)
			case <-ctx.Done():
				return ctx.Err()
			}
			rec := claims[i]
			rec.Transition, rec.Phase, rec.Epoch, rec.Result = assignment.Completed, assignment.Completed, assignment.Epoch(seq), "success"
			rec.Actor, rec.At = "generator", at.Add(time.Minute)
			var err error
			if dones[i], err = l.publishAsync(rec); err != nil {
				return err
			}
		}
		for i, f := range dones {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("eventlog: generate task %d: %w", claims[i].Task, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

func (l *Log) publishAsync(rec assignment.Record) (jetstream.PubAckFuture, error) {
	msg := nats.NewMsg(RecordSubject(rec.Task, rec.Transition))
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("eventlog: encode record: %w", err)
	}
	msg.Data = data
	l.sign.sign(msg)
	f, err := l.js.PublishMsgAsync(msg)
	if err != nil {
		return nil, fmt.Errorf("eventlog: generate task %d: %w", rec.Task, err)
	}
	return f, nil
}
