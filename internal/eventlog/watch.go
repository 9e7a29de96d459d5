package eventlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Watch loads the live assignments into v and then follows new transitions until ctx ends.
// It returns nil on cancellation. Every v.OnChange must come before it.
//
// It reads the records after the live index's tail, then the last record of every task the
// index names that those did not, repairs the index (keys for live assignments it lacks, none
// for ended ones) and moves its tail; then v is ready and Watch follows the stream. The cost of
// a start is the live assignments and the records since the tail, not the history. While it
// follows, Watch keeps the index complete for what it saw (BucketLive).
func (l *Log) Watch(ctx context.Context, v *View) error {
	v.feed()
	tail, _, err := l.liveTail(ctx)
	if err != nil {
		return fmt.Errorf("eventlog: watch: %w", err)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{AllRecords}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if tail > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, tail+1
	}
	c, err := l.asg.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("eventlog: watch: %w", err)
	}
	it, err := c.Messages()
	if err != nil {
		return fmt.Errorf("eventlog: watch: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()

	w := liveWatch{l: l, v: v, seen: tail, pending: map[assignment.TaskID]bool{}, indexed: map[assignment.TaskID]bool{}}
	if err := w.loadIfCaughtUp(ctx); err != nil {
		return err
	}
	for {
		wait := livePassEvery // a following view checks what it saw when the stream is quiet
		if !w.loaded {
			wait = catchUpProbe
		}
		msg, err := it.Next(jetstream.NextMaxWait(max(wait, 10*time.Millisecond)))
		if errors.Is(err, nats.ErrTimeout) {
			if !w.loaded {
				if err := w.loadIfCaughtUp(ctx); err != nil {
					return err
				}
				if !w.loaded {
					// The stream holds records after the last one read, and the consumer
					// delivered none of them in this wait.
					if w.stalls++; w.stalls >= maxStalls {
						return fmt.Errorf("eventlog: watch: at stream sequence %d: %w", w.seen, ErrStalled)
					}
				}
			} else if len(w.pending) > 0 {
				w.pass(ctx)
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("eventlog: watch: %w", err)
		}
		w.stalls = 0
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		s, ok := l.appended.get(md.Sequence.Stream, msg.Subject(), msg.Data())
		if !ok {
			s, err = l.decodeRecord(msg.Subject(), msg.Headers(), msg.Data(), md.Sequence.Stream)
		}
		if err == nil {
			w.observe(s)
		} else {
			// Not believed: quarantined, and the task's state read again without it.
			l.quarantine(ctx, l.asg, StreamAssignments, msg.Subject(), md.Sequence.Stream, msg.Data(), err)
			if task, _, perr := parseRecordSubject(msg.Subject()); perr == nil {
				if s, gerr := l.Get(ctx, task); gerr == nil {
					w.observe(s)
				}
			}
		}
		w.seen = max(w.seen, md.Sequence.Stream)
		switch {
		case !w.loaded && md.NumPending == 0:
			if err := w.load(ctx); err != nil {
				return err
			}
		case w.loaded && (len(w.pending) >= maxPending || md.NumPending == 0 && time.Since(w.passed) >= livePassEvery):
			w.pass(ctx)
		}
	}
}

// catchUpProbe is how long a starting view waits for a record before it asks the stream
// whether there is one left to read (the last one may have been quarantined meanwhile).
const catchUpProbe = 2 * time.Second

// maxStalls is how many catchUpProbe waits in a row a starting view accepts in which its
// consumer delivered nothing though the stream holds records after the last one read; then
// Watch fails with ErrStalled (10 s with the defaults).
const maxStalls = 5

// ErrStalled: a starting view's consumer delivered none of the records the stream holds after
// its position for maxStalls probes in a row (seen after NATS nodes were cut off and came
// back). The view is not ready; Watch returns it so that its caller starts it again, with a
// new consumer, as it does after other transient JetStream errors.
var ErrStalled = errors.New("the consumer delivers none of the records the stream holds")

// maxPending is how many tasks a following view remembers before it checks their keys even
// though livePassEvery has not passed.
const maxPending = 4096

// liveWatch is Watch's state: what it saw and which keys it knows to exist.
type liveWatch struct {
	l *Log
	v *View
	// seen is the last stream sequence read.
	seen uint64
	// pending are the tasks seen live since the last pass, whose keys it has not checked.
	pending map[assignment.TaskID]bool
	// indexed are the live tasks whose keys it knows exist.
	indexed map[assignment.TaskID]bool
	loaded  bool
	passed  time.Time
	// stalls counts the probes in a row that found records the consumer did not deliver.
	stalls int
}

func (w *liveWatch) observe(s assignment.State) {
	w.v.Observe(s)
	if !s.Live() {
		delete(w.indexed, s.Task)
		delete(w.pending, s.Task)
		w.l.keyed.take(s.Task)
		return
	}
	if w.loaded && !w.indexed[s.Task] {
		w.pending[s.Task] = true
	}
}

// loadIfCaughtUp completes the start (load) when the stream holds no record after the last
// one read.
func (w *liveWatch) loadIfCaughtUp(ctx context.Context) error {
	_, err := w.l.asg.GetMsg(ctx, w.seen+1, jetstream.WithGetMsgSubject(AllRecords))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return w.load(ctx)
	case err != nil && ctx.Err() == nil:
		return fmt.Errorf("eventlog: watch: %w", err)
	}
	return nil
}

// load completes the start once the records after the tail are read: the index's live
// assignments the records did not show are read by their subjects, the index is repaired,
// its tail moved, and the view made ready.
func (w *liveWatch) load(ctx context.Context) error {
	keys, err := w.l.liveKeys(ctx)
	if err != nil {
		return fmt.Errorf("eventlog: watch: %w", err)
	}
	for task := range keys {
		if _, ok := w.v.Get(task); ok {
			continue // read after the tail
		}
		st, err := w.l.Get(ctx, task)
		switch {
		case err == nil:
			w.v.Observe(st)
		case errors.Is(err, assignment.ErrNotFound):
		default:
			return fmt.Errorf("eventlog: watch: %w", err)
		}
	}
	// Repair: every live assignment gets its key, ended (or unknown) ones lose theirs.
	var errs []error
	for _, st := range w.v.Live() {
		if keys[st.Task] {
			w.indexed[st.Task] = true
			continue
		}
		if err := w.l.ensureIndexed(ctx, st); err != nil {
			errs = append(errs, err)
			continue
		}
		w.indexed[st.Task] = true
	}
	for task := range keys {
		if !w.indexed[task] {
			if err := w.l.unindex(ctx, task); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		// The tail stays where it was: the next start reads these records again.
		w.l.reportIndex(err)
	} else if err := w.l.advanceTail(ctx, w.seen); err != nil {
		w.l.reportIndex(err)
	}
	w.loaded, w.passed = true, time.Now()
	w.v.markReady()
	return nil
}

// pass makes sure every live task seen since the last pass has its key, then moves the
// index's tail to the last record read. On an error the tail stays and the tasks are checked
// again at the next pass.
func (w *liveWatch) pass(ctx context.Context) {
	w.passed = time.Now()
	var errs []error
	for task := range w.pending {
		st, ok := w.v.Get(task)
		if !ok || !st.Live() {
			delete(w.pending, task)
			continue
		}
		if !w.l.keyed.take(task) {
			if err := w.l.ensureIndexed(ctx, st); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		w.indexed[task] = true
		delete(w.pending, task)
	}
	if err := errors.Join(errs...); err != nil {
		w.l.reportIndex(err)
		return
	}
	if err := w.l.advanceTail(ctx, w.seen); err != nil {
		w.l.reportIndex(err)
	}
}

// reportIndex hands an error keeping the live index to Config.OnIndexError.
func (l *Log) reportIndex(err error) {
	if l.cfg.OnIndexError != nil {
		l.cfg.OnIndexError(err)
	}
}
