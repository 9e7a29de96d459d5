package fleet

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// Capacity returns the tiers' capacity from the heartbeats in components: the slots of the
// workers that take work. A draining worker adds none: what it still holds counts against the
// others' slots until it ends, so admission errs on the side of too few. (Its heartbeat's
// in-flight count lags the jobs that end on it, and counting that would admit claims no
// worker takes before their pickup deadline.) A tier without workers has capacity 0.
func Capacity(components []liveness.Record) map[assignment.Backend]int {
	out := map[assignment.Backend]int{assignment.BackendPod: 0, assignment.BackendVM: 0}
	for _, r := range components {
		if r.Worker == nil {
			continue
		}
		if !r.Worker.Draining {
			out[tierOf(r)] += r.Worker.Capacity
		}
	}
	return out
}

// CapacityFollower follows the capacity the workers online announce (ADMIT_CAPACITY=workers):
// per tier, the slots of the workers taking work (Capacity). Run reads the heartbeats every
// Every; Get is the scheduler's CapacityOf.
type CapacityFollower struct {
	// JS reads the heartbeats (ReadComponents).
	JS jetstream.JetStream
	// Every is the time between readings.
	Every time.Duration
	// Stale is how old a reading may be and still count (LIVENESS_TTL): with none newer, Get
	// reports none, and the scheduler admits nothing until the heartbeats read again.
	Stale time.Duration

	mu   sync.Mutex
	last map[assignment.Backend]int
	at   time.Time
}

// Run reads the heartbeats until ctx ends, and returns nil then. A reading that fails keeps
// the last one, which goes stale.
func (f *CapacityFollower) Run(ctx context.Context) error {
	for {
		// Each reading is bounded: one that hangs (a watch whose initial values never
		// arrive) must go stale like one that fails, not stop the readings for good.
		rctx, cancel := context.WithTimeout(ctx, readingTimeout)
		records, _, err := ReadComponents(rctx, f.JS)
		cancel()
		if err == nil {
			f.mu.Lock()
			f.last, f.at = Capacity(records), time.Now()
			f.mu.Unlock()
		}
		if clock.Sleep(ctx, f.Every) != nil {
			return nil //nolint:nilerr // the context ended: a stop, not a failure
		}
	}
}

// readingTimeout bounds one reading of the heartbeats.
const readingTimeout = 10 * time.Second

// Get returns the last reading's capacity per tier, and false when there is none or it is
// older than Stale.
func (f *CapacityFollower) Get() (map[assignment.Backend]int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil || time.Since(f.at) > f.Stale {
		return nil, false
	}
	return f.last, true
}
