package eventlog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// View is a component's read model of all assignments, rebuilt from JetStream by Watch. It is
// a cache: every decision is still checked by a compare-and-swap append.
type View struct {
	mu     sync.RWMutex
	states map[assignment.TaskID]assignment.State
	ready  chan struct{}
	once   sync.Once
	subs   []func(assignment.State)
}

// NewView returns an empty view.
func NewView() *View {
	return &View{states: make(map[assignment.TaskID]assignment.State), ready: make(chan struct{})}
}

// OnChange registers fn to be called (from the watch goroutine, or the goroutine of an
// Observe) with every state the view learns from then on, the initial replay included when it
// is registered before Watch starts. It is safe to call while Watch runs.
func (v *View) OnChange(fn func(assignment.State)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.subs = append(v.subs, fn)
}

// Ready is closed once the view has caught up with the stream.
func (v *View) Ready() <-chan struct{} { return v.ready }

// Get returns the last known state of a task.
func (v *View) Get(task assignment.TaskID) (assignment.State, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	s, ok := v.states[task]
	return s, ok
}

// Live returns the states of all assignments not yet ended.
func (v *View) Live() []assignment.State {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]assignment.State, 0, len(v.states))
	for _, s := range v.states {
		if s.Live() {
			out = append(out, s)
		}
	}
	return out
}

// Ended returns the states of all assignments that ended.
func (v *View) Ended() []assignment.State {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []assignment.State
	for _, s := range v.states {
		if !s.Live() {
			out = append(out, s)
		}
	}
	return out
}

// Forget removes ended assignments last changed before cutoff, bounding the view's memory in
// a long-running controller, and returns their task ids.
func (v *View) Forget(cutoff time.Time) []assignment.TaskID {
	v.mu.Lock()
	defer v.mu.Unlock()
	var gone []assignment.TaskID
	for id, s := range v.states {
		if !s.Live() && s.At.Before(cutoff) {
			delete(v.states, id)
			gone = append(gone, id)
		}
	}
	return gone
}

// Len counts the assignments the view holds.
func (v *View) Len() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.states)
}

// Observe folds a state into the view if it is newer than what the view has; components call
// it with the result of their own appends so they need not wait for the watch.
func (v *View) Observe(s assignment.State) {
	v.mu.Lock()
	old, ok := v.states[s.Task]
	newer := !ok || s.Seq > old.Seq
	if newer {
		// Ended assignments stay as their last state so late reports get a clear answer; the
		// stream's retention bounds how many a restart reloads.
		v.states[s.Task] = s
	}
	subs := v.subs // appends never change the elements a copy of the header sees
	v.mu.Unlock()
	if newer {
		for _, fn := range subs {
			fn(s)
		}
	}
}

// Watch replays the last state of every assignment and then follows new transitions until ctx
// ends. It returns nil on cancellation.
func (l *Log) Watch(ctx context.Context, v *View) error {
	info, err := l.asg.Info(ctx)
	if err != nil {
		return fmt.Errorf("eventlog: watch: %w", err)
	}
	if info.State.Msgs == 0 {
		v.once.Do(func() { close(v.ready) })
	}
	c, err := l.asg.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{AllRecords},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
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
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("eventlog: watch: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		s, err := l.decodeRecord(msg.Subject(), msg.Headers(), msg.Data(), md.Sequence.Stream)
		if err == nil {
			v.Observe(s)
		} else {
			// Not believed: quarantined, and the task's state read again without it.
			l.quarantine(ctx, l.asg, StreamAssignments, msg.Subject(), md.Sequence.Stream, msg.Data(), err)
			if task, _, perr := parseRecordSubject(msg.Subject()); perr == nil {
				if s, gerr := l.Get(ctx, task); gerr == nil {
					v.Observe(s)
				}
			}
		}
		if md.NumPending == 0 {
			v.once.Do(func() { close(v.ready) })
		}
	}
}
