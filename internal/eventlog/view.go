package eventlog

import (
	"errors"
	"iter"
	"slices"
	"sync"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// View is a component's read model of the assignments, fed by Watch. It is a cache: every
// decision is still checked by a compare-and-swap append.
//
// It holds every live assignment and the last MaxEnded that ended (in the order the view saw
// them end); older ended assignments are read from JetStream by whoever needs them
// (Log.Get), so its memory depends on the live work, not on the history.
//
// A view is subscribed before it is fed: every OnChange comes before the Watch that feeds the
// view starts, so each subscriber hears the initial load and the subscriber list never
// changes while the view is fed. OnChange after Watch started panics.
type View struct {
	mu     sync.RWMutex
	states map[assignment.TaskID]assignment.State
	// ended is a ring of the tasks that ended, oldest at next once it is full.
	ended []assignment.TaskID
	next  int
	ready chan struct{}
	once  sync.Once
	// subs is fixed once fed is set, by Watch.
	subs []func(assignment.State)
	fed  bool
}

// MaxEnded is how many ended assignments a View keeps.
const MaxEnded = 1024

// NewView returns an empty view.
func NewView() *View {
	return &View{states: make(map[assignment.TaskID]assignment.State), ready: make(chan struct{})}
}

// OnChange registers fn to be called (from the watch goroutine, or the goroutine of an
// Observe) with every state the view learns, the initial load included. It must be called
// before Watch starts feeding the view: a subscriber registered later would miss the load,
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

// Ready is closed once the view holds every live assignment and follows the stream.
func (v *View) Ready() <-chan struct{} { return v.ready }

func (v *View) markReady() { v.once.Do(func() { close(v.ready) }) }

// Get returns the last known state of a task: of every live assignment, and of the last
// MaxEnded that ended. Not knowing a task is no proof it has no assignment: ask Log.Get.
func (v *View) Get(task assignment.TaskID) (assignment.State, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	s, ok := v.states[task]
	return s, ok
}

// Live returns the states of all assignments not yet ended.
func (v *View) Live() []assignment.State {
	return slices.AppendSeq([]assignment.State{}, v.LiveStates()) // empty, not nil, as before
}

// LiveStates yields the state of every assignment not yet ended, under the view's read lock:
// no state is copied to the heap, so counting the live assignments copies none. The loop's
// body must not block or call the view (a write waiting for the lock would deadlock it).
func (v *View) LiveStates() iter.Seq[assignment.State] {
	return func(yield func(assignment.State) bool) {
		v.mu.RLock()
		defer v.mu.RUnlock()
		for _, s := range v.states {
			if s.Live() && !yield(s) {
				return
			}
		}
	}
}

// LiveTasks returns the task ids of all assignments not yet ended.
func (v *View) LiveTasks() []assignment.TaskID {
	v.mu.RLock()
	n := len(v.states) // the live ones and at most MaxEnded more: one allocation, not a dozen
	v.mu.RUnlock()
	out := make([]assignment.TaskID, 0, n)
	for s := range v.LiveStates() {
		out = append(out, s.Task)
	}
	return out
}

// Ended returns the states of the ended assignments the view holds (at most MaxEnded).
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

// Forget removes ended assignments last changed before cutoff and returns their task ids.
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
	newer := v.fold(s)
	subs := v.subs
	v.mu.Unlock()
	if newer {
		for _, fn := range subs {
			fn(s)
		}
	}
}

// fold is Observe's change to the view, under v.mu; it reports whether s was newer.
func (v *View) fold(s assignment.State) bool {
	old, ok := v.states[s.Task]
	if ok && s.Seq <= old.Seq {
		return false
	}
	v.states[s.Task] = s
	if s.Live() || (ok && !old.Live()) {
		return true
	}
	// s ends the assignment: it takes a place in the ring of ended ones, pushing the oldest
	// out. Ended assignments stay so late reports get a clear answer without a read.
	if len(v.ended) < MaxEnded {
		v.ended = append(v.ended, s.Task)
		return true
	}
	if gone := v.ended[v.next]; gone != s.Task {
		if g, ok := v.states[gone]; ok && !g.Live() {
			delete(v.states, gone)
		}
	}
	v.ended[v.next] = s.Task
	v.next = (v.next + 1) % MaxEnded
	return true
}
