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

// keyWriteTimeout is how long a write of WriteWorkers may await its acknowledgement: as long as
// jetstream gives a synchronous publish. The handle WriteWorkers publishes on fails a write
// whose acknowledgement has not come by then and forgets it, so a write given up on (the
// caller's ctx ended, the stream lost its quorum) never stays pending on it.
const keyWriteTimeout = 5 * time.Second

// newKeyWriter is the JetStream handle WriteWorkers publishes on: on nc, as the log's, but of
// its own, with keyWriteTimeout, so its pending writes neither last nor count against the
// pending limit of the handle the rest of the process shares.
func newKeyWriter(nc *nats.Conn) (jetstream.JetStream, error) {
	return jetstream.New(nc, jetstream.WithPublishAsyncTimeout(keyWriteTimeout))
}

// WriteWorkers makes the writes ws to BucketWorkers pipelined: each is published without
// waiting for the one before to be acknowledged, at most keyWriteWindow in flight, so renewing
// a worker's 10,000 environment keys costs about one round trip per window instead of one
// per key (BenchmarkWriteWorkers). Each write keeps its own compare-and-swap: Rev must be the
// key's current revision (a revision of 0, "only if absent", is no use to its callers, which
// write keys they hold). revs[i] is ws[i]'s key's new revision, errs[i] its error,
// jetstream.ErrKeyRevisionMismatch when the key was no longer at ws[i].Rev (another worker
// wrote it, or it expired). The writes are independent: one failing does not stop the others;
// a write not acknowledged within keyWriteTimeout of its publish fails, and once ctx is done
// those not yet acknowledged fail with its error.
func (l *Log) WriteWorkers(ctx context.Context, ws []KeyWrite) (revs []uint64, errs []error) {
	revs, errs = make([]uint64, len(ws)), make([]error, len(ws))
	type pending struct {
		i int
		f jetstream.PubAckFuture
	}
	var inflight []pending
	await := func(p pending) {
		var err error
		select { // an answer already there wins over a ctx done meanwhile
		case ack := <-p.f.Ok():
			revs[p.i] = ack.Sequence
			return
		case err = <-p.f.Err():
		default:
			select {
			case ack := <-p.f.Ok():
				revs[p.i] = ack.Sequence
				return
			case err = <-p.f.Err():
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if KeyTaken(err) {
			err = fmt.Errorf("%w: %w", jetstream.ErrKeyRevisionMismatch, err)
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
		f, err := l.keyWriter.PublishMsgAsync(msg, jetstream.WithExpectLastSequencePerSubject(w.Rev))
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
