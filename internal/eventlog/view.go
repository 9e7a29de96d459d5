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
//
// A view is subscribed before it is fed: every OnChange comes before the Watch that feeds the
// view starts, so each subscriber hears the initial replay and the subscriber list never
// changes while the view is fed. OnChange after Watch started panics.
type View struct {
	mu     sync.RWMutex
	states map[assignment.TaskID]assignment.State
	ready  chan struct{}
	once   sync.Once
	// subs is fixed once fed is set, by Watch.
	subs []func(assignment.State)
	fed  bool
}

// NewView returns an empty view.
func NewView() *View {
	return &View{states: make(map[assignment.TaskID]assignment.State), ready: make(chan struct{})}
}

// OnChange registers fn to be called (from the watch goroutine, or the goroutine of an
// Observe) with every state the view learns, the initial replay included. It must be called
// before Watch starts feeding the view: a subscriber registered later would miss the replay,
// so OnChange then panics (a wiring mistake, like net/http's duplicate pattern).
func (v *View) OnChange(fn func(assignment.State)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.fed {
		panic(ErrSubscribedLate)
	}
	v.subs = append(v.subs, fn)
}

// ErrSubscribedLate is what OnChange panics with when Watch already feeds the view.
var ErrSubscribedLate = errors.New("eventlog: View.OnChange after Watch started feeding the view: subscribe every consumer before starting Watch")

// feed marks the view as fed: from now on its subscribers are fixed.
func (v *View) feed() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.fed = true
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
	subs := v.subs
	v.mu.Unlock()
	if newer {
		for _, fn := range subs {
			fn(s)
		}
	}
}

// Watch replays the last state of every assignment into v and then follows new transitions
// until ctx ends. It returns nil on cancellation. Every v.OnChange must come before it.
func (l *Log) Watch(ctx context.Context, v *View) error {
	v.feed()
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
