package eventlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// KeyWrite is one compare-and-swap write of a key in BucketWorkers: Value is put, or the key
// deleted (Delete), only while the key is still at revision Rev.
type KeyWrite struct {
	Key    string
	Value  []byte
	Rev    uint64
	Delete bool
}

// keyWriteWindow is how many of WriteWorkers' writes may await their acknowledgement at once:
// enough to keep the server busy across a round trip, well under the JetStream handle's own
// limit of pending asynchronous publishes (4,000 by default), which other callers share.
const keyWriteWindow = 256

// keyWriteTimeout bounds the wait for one write's acknowledgement when ctx has no deadline, as
// jetstream bounds a synchronous publish.
const keyWriteTimeout = 5 * time.Second

// WriteWorkers makes the writes ws to BucketWorkers pipelined: each is published without
// waiting for the one before to be acknowledged, at most keyWriteWindow in flight, so renewing
// a worker's 10,000 environment keys costs about one round trip per window instead of one
// per key. Each write keeps its own compare-and-swap: revs[i] is ws[i]'s key's new revision,
// errs[i] its error, jetstream.ErrKeyRevisionMismatch when the key was no longer at ws[i].Rev
// (another worker wrote it, or it expired). The writes are independent: one failing does not
// stop the others, except that a done ctx fails those not yet acknowledged.
func (l *Log) WriteWorkers(ctx context.Context, ws []KeyWrite) (revs []uint64, errs []error) {
	revs, errs = make([]uint64, len(ws)), make([]error, len(ws))
	type pending struct {
		i int
		f jetstream.PubAckFuture
	}
	var inflight []pending
	await := func(p pending) {
		timer := time.NewTimer(keyWriteTimeout)
		defer timer.Stop()
		var err error
		select {
		case ack := <-p.f.Ok():
			revs[p.i] = ack.Sequence
			return
		case err = <-p.f.Err():
			if KeyTaken(err) {
				err = fmt.Errorf("%w: %w", jetstream.ErrKeyRevisionMismatch, err)
			}
		case <-ctx.Done():
			err = ctx.Err()
		case <-timer.C:
			err = fmt.Errorf("no acknowledgement in %s: %w", keyWriteTimeout, context.DeadlineExceeded)
		}
		errs[p.i] = fmt.Errorf("eventlog: write %s: %w", ws[p.i].Key, err)
	}
	for i, w := range ws {
		if len(inflight) == keyWriteWindow {
			await(inflight[0])
			inflight = inflight[1:]
		}
		if err := ctx.Err(); err != nil {
			errs[i] = fmt.Errorf("eventlog: write %s: %w", w.Key, err)
			continue
		}
		msg := nats.NewMsg("$KV." + BucketWorkers + "." + w.Key)
		if w.Delete {
			msg.Header.Set("KV-Operation", "DEL")
		} else {
			msg.Data = w.Value
		}
		f, err := l.js.PublishMsgAsync(msg, jetstream.WithExpectLastSequencePerSubject(w.Rev))
		if err != nil {
			errs[i] = fmt.Errorf("eventlog: write %s: %w", w.Key, err)
			continue
		}
		inflight = append(inflight, pending{i, f})
	}
	for _, p := range inflight {
		await(p)
	}
	return revs, errs
}

// KeyTaken reports whether a compare-and-swap write of a key (a KV Create or Update, or one of
// WriteWorkers') lost to another writer. Besides the errors nats.go names, a stream answers
// with its wrong-last-sequence error, unwrapped: a replicated bucket so answers a Create over a
// delete marker, and a pipelined write always.
func KeyTaken(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || isConflict(err)
}
