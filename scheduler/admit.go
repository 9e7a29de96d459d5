package scheduler

import (
	"cmp"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Fairness orders admission from the queue.
type Fairness string

const (
	// FairnessFIFO admits queued claims in the order they were claimed (FAIRNESS unset).
	FairnessFIFO Fairness = ""
	// FairnessOwner admits, at each free slot, the oldest queued claim of the repository owner
	// holding the fewest environments of the tier (FAIRNESS=owner): admission fairness, not a
	// quota.
	FairnessOwner Fairness = "owner"
)

// ParseFairness accepts "", "fifo" or "owner".
func ParseFairness(s string) (Fairness, error) {
	switch strings.ToLower(s) {
	case "", "fifo", "off":
		return FairnessFIFO, nil
	case "owner":
		return FairnessOwner, nil
	}
	return "", fmt.Errorf("FAIRNESS=%q: want owner, or unset for first in, first out", s)
}

// Admission configures the admission queue. Its zero value is no queue: the scheduler stops
// fetching while a tier is full, as before queues existed.
type Admission struct {
	// MaxQueued is how many claims of one tier may wait for capacity (MAX_QUEUED); while a tier
	// has that many waiting the scheduler fetches nothing, so it never hoards the forge's queue.
	// Zero disables the queue.
	MaxQueued int
	// Queue bounds a claim's wait (QUEUE_SECS): one not admitted within it fails upstream with a
	// message that says the fleet was full.
	Queue time.Duration
	// Fairness orders admission (FAIRNESS).
	Fairness Fairness
	// ShareCap bounds the environments one owner may hold in flight across the tiers
	// (FAIR_SHARE_CAP); zero is no bound.
	ShareCap int
}

// Enabled reports whether claims may queue.
func (a Admission) Enabled() bool { return a.MaxQueued > 0 }

// load is what the live assignments hold and want, per tier and per owner.
type load struct {
	inFlight map[assignment.Backend]int
	queued   map[assignment.Backend]int
	// ownerTier counts in-flight environments per tier and owner; owner across the tiers.
	ownerTier map[assignment.Backend]map[string]int
	owner     map[string]int
	// queuedOwner counts queued claims per tier and owner.
	queuedOwner map[assignment.Backend]map[string]int
}

// count is tally of the states live yields, counting per owner only when owners is set: the
// fetch loop, which asks only whether a tier is full, runs it for every fetch.
func count(live iter.Seq[assignment.State], owners bool) load {
	l := newLoad()
	for st := range live {
		l.observe(st, owners)
	}
	return l
}

func newLoad() load {
	return load{
		inFlight: map[assignment.Backend]int{}, queued: map[assignment.Backend]int{},
		ownerTier: map[assignment.Backend]map[string]int{}, owner: map[string]int{},
		queuedOwner: map[assignment.Backend]map[string]int{},
	}
}

// observe counts st, per owner too when owners is set.
func (l load) observe(st assignment.State, owners bool) {
	switch {
	case st.InFlight():
		l.inFlight[st.Backend]++
		if owners {
			l.add(l.ownerTier, st.Backend, st.Owner())
			l.owner[st.Owner()]++
		}
	case st.Waiting():
		l.queued[st.Backend]++
		if owners {
			l.add(l.queuedOwner, st.Backend, st.Owner())
		}
	}
}

func (load) add(m map[assignment.Backend]map[string]int, b assignment.Backend, owner string) {
	if m[b] == nil {
		m[b] = map[string]int{}
	}
	m[b][owner]++
}

// full reports whether tier b has no free capacity; a tier without a capacity is never full.
func (l load) full(capacity map[assignment.Backend]int, b assignment.Backend) bool {
	c, ok := capacity[b]
	return ok && l.inFlight[b] >= c
}

// paused reports whether the scheduler must not fetch: without a queue, while any enabled tier
// is full (a task the forge hands over cannot be given back, and one claimed for a full tier
// would miss its pickup deadline); with one, while any enabled tier's queue is full.
func paused(l load, capacity map[assignment.Backend]int, backends []assignment.Backend, adm Admission) bool {
	for _, b := range backends {
		if !adm.Enabled() && l.full(capacity, b) {
			return true
		}
		if adm.Enabled() && l.queued[b] >= adm.MaxQueued {
			return true
		}
	}
	return false
}

// queueOnClaim reports whether a new claim for tier b of owner waits in the queue rather than
// going to a worker at once: its tier is full, others of its tier wait already (they come
// first), or its owner holds its share cap.
func queueOnClaim(l load, capacity map[assignment.Backend]int, adm Admission, b assignment.Backend, owner string) bool {
	if !adm.Enabled() {
		return false
	}
	return l.full(capacity, b) || l.queued[b] > 0 || (adm.ShareCap > 0 && l.owner[owner] >= adm.ShareCap)
}

// planAdmit decides which queued claims get capacity now, in the order they are to be
// admitted: per tier, as many as the tier has free slots, first in, first out or fairly across
// owners (Admission.Fairness), skipping owners at their share cap and claims whose queue
// deadline passed (the reconciler fails those). It is a pure function of the live assignments,
// so any scheduler replica decides the same. It reads live once (View.LiveStates: under the
// view's lock, so one consistent set) and copies only the queued claims.
func planAdmit(live iter.Seq[assignment.State], capacity map[assignment.Backend]int, adm Admission, now time.Time) []assignment.State {
	if !adm.Enabled() {
		return nil
	}
	l := newLoad()
	waiting := map[assignment.Backend][]assignment.State{}
	for st := range live {
		l.observe(st, true)
		if st.Waiting() && !now.After(st.QueueDeadline) {
			waiting[st.Backend] = append(waiting[st.Backend], st)
		}
	}
	var admit []assignment.State
	for _, b := range slices.Sorted(maps.Keys(waiting)) {
		q := waiting[b]
		slices.SortFunc(q, func(x, y assignment.State) int { return cmp.Compare(x.Epoch(), y.Epoch()) })
		free := len(q) // a tier without a capacity admits all
		if c, ok := capacity[b]; ok {
			free = c - l.inFlight[b]
		}
		for ; free > 0; free-- {
			i := pick(q, l, b, adm)
			if i < 0 {
				break
			}
			st := q[i]
			q = slices.Delete(q, i, i+1)
			admit = append(admit, st)
			l.add(l.ownerTier, b, st.Owner())
			l.owner[st.Owner()]++
			l.inFlight[b]++
		}
	}
	return admit
}

// pick returns the index in q (ordered by claim) of the claim to admit next, or -1 when every
// waiting owner holds its share cap.
func pick(q []assignment.State, l load, b assignment.Backend, adm Admission) int {
	best := -1
	for i, st := range q {
		o := st.Owner()
		if adm.ShareCap > 0 && l.owner[o] >= adm.ShareCap {
			continue
		}
		if adm.Fairness != FairnessOwner {
			return i // the oldest claim whose owner may hold one more
		}
		// The owner with the fewest environments of the tier; between equals, the one whose
		// claim is older (q is in claim order, so the first seen).
		if best < 0 || l.ownerTier[b][o] < l.ownerTier[b][q[best].Owner()] {
			best = i
		}
	}
	return best
}
