// Package lease is a single owner of a piece of work among replicas, decided in JetStream: a key
// of the KV bucket eventlog.BucketLeases held by compare-and-swap and renewed on a timer. The
// scheduler's reconcile loop and the GitHub forge's message sessions each hold one.
package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// MinTTL is the shortest lease a Lease accepts: it renews every third of it.
const MinTTL = 3 * time.Second

// renewalsPerTTL is how often a holder renews its lease within the lease's TTL.
const renewalsPerTTL = 3

// Lease is one replica's hold on a key of eventlog.BucketLeases. Which replica holds
// it is decided in JetStream, never by timing between replicas: a replica takes the key with a
// KV create (only if absent) and renews it with an update on the revision it last wrote, so two
// replicas never both succeed. The key expires the bucket's TTL after its last write; the
// holder renews it every third of the TTL.
//
// A holder believes it holds the lease only until TTL after it sent its last successful write,
// measured by its own monotonic clock, which is never later than the key's expiry in the
// server. A holder that pauses (a stopped process, a long GC pause, a partition) past that point
// acts no more on its belief: Held turns false and the contexts from Context end, before any
// other replica can take the key.
type Lease struct {
	kv       jetstream.KeyValue
	key      string
	holder   string
	ttl      time.Duration
	log      zerolog.Logger
	now      func() time.Time // a monotonic clock; time.Now
	onChange func(held bool)

	mu sync.Mutex
	// rev is the key's revision this holder last wrote (0: none), until when it believes it
	// holds the lease (the zero time: it does not).
	rev   uint64
	until time.Time
	held  bool // last reported to onChange
}

// New returns a lease on key in kv (eventlog.BucketLeases), held under the name holder (a
// component's actor, unique per process). ttl is the bucket's TTL (eventlog.Config.LeasesTTL),
// at least MinTTL. onChange, when set, hears every change of Held that Run notices.
func New(kv jetstream.KeyValue, key, holder string, ttl time.Duration, log zerolog.Logger, onChange func(held bool), opts ...Option) *Lease {
	if onChange == nil {
		onChange = func(bool) {}
	}
	l := &Lease{kv: kv, key: key, holder: holder, ttl: max(ttl, MinTTL), log: log, now: time.Now, onChange: onChange}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Option configures a Lease.
type Option func(*Lease)

// WithClock makes the lease measure its belief with now instead of time.Now (tests pause a
// holder with it).
func WithClock(now func() time.Time) Option { return func(l *Lease) { l.now = now } }

// Held reports whether this replica holds the lease now.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldLocked()
}

func (l *Lease) heldLocked() bool { return l.rev != 0 && l.now().Before(l.until) }

// Context returns a context derived from ctx that ends when this replica's belief in the lease
// does, and false (with ctx itself) when it does not hold the lease. Calls made under it to the
// forge are not sent after the lease may have passed to another replica.
func (l *Lease) Context(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	l.mu.Lock()
	held, until := l.heldLocked(), l.until
	l.mu.Unlock()
	if !held {
		return ctx, func() {}, false
	}
	c, cancel := context.WithDeadline(ctx, until)
	return c, cancel, true
}

// Run takes the lease and renews it until ctx ends, then releases it so another replica takes
// over at once. It returns nil on cancellation.
func (l *Lease) Run(ctx context.Context) error {
	every := l.ttl / renewalsPerTTL
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		l.Renew(ctx)
		select {
		case <-ctx.Done():
			l.release()
			return nil
		case <-t.C:
		}
	}
}

// Renew writes the key once: an update on the revision this replica last wrote, or a create
// when it holds none. Run calls it every third of the TTL; tests call it to take a step.
func (l *Lease) Renew(ctx context.Context) {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	sent := l.now()
	var err error
	if rev != 0 {
		var next uint64
		next, err = l.kv.Update(ctx, l.key, []byte(l.holder), rev)
		if err == nil {
			l.hold(next, sent)
			return
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// NATS did not answer: keep the revision, so the next renewal can still extend
			// the lease if the key is there, but do not extend the belief.
			l.log.Warn().Err(err).Str("lease", l.key).Msg("renew lease")
			l.report()
			return
		}
		// The key expired or another replica took it.
		l.drop("the lease expired before it was renewed")
		sent = l.now()
	}
	next, err := l.kv.Create(ctx, l.key, []byte(l.holder))
	if err == nil {
		l.hold(next, sent)
		return
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		l.log.Warn().Err(err).Str("lease", l.key).Msg("take lease")
		return
	}
	// Held by someone. If it is this replica's own write whose answer was lost, adopt its
	// revision without believing in it: the next renewal updates it and starts the belief.
	e, err := l.kv.Get(ctx, l.key)
	if err == nil && string(e.Value()) == l.holder {
		l.mu.Lock()
		l.rev = e.Revision()
		l.mu.Unlock()
	}
}

// hold records a successful write of revision rev sent at sent.
func (l *Lease) hold(rev uint64, sent time.Time) {
	l.mu.Lock()
	l.rev, l.until = rev, sent.Add(l.ttl)
	l.mu.Unlock()
	l.report()
}

// drop forgets the lease.
func (l *Lease) drop(why string) {
	l.mu.Lock()
	l.rev, l.until = 0, time.Time{}
	l.mu.Unlock()
	if l.report(); why != "" {
		l.log.Debug().Str("lease", l.key).Msg(why)
	}
}

// report tells onChange and the log when Held changed since the last report.
func (l *Lease) report() {
	l.mu.Lock()
	held := l.heldLocked()
	changed := held != l.held
	l.held = held
	l.mu.Unlock()
	if !changed {
		return
	}
	if held {
		l.log.Info().Str("lease", l.key).Str("holder", l.holder).Msg("holding the lease")
	} else {
		l.log.Warn().Str("lease", l.key).Str("holder", l.holder).Msg("lost the lease")
	}
	l.onChange(held)
}

// release deletes the key if this replica still holds it, so another takes over without
// waiting for it to expire.
func (l *Lease) release() {
	l.mu.Lock()
	rev, held := l.rev, l.heldLocked()
	l.rev, l.until = 0, time.Time{}
	l.mu.Unlock()
	if held {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev)); err != nil {
			l.log.Warn().Err(err).Str("lease", l.key).Msg("release lease; another replica takes over when it expires")
		}
	}
	l.mu.Lock()
	l.held = false
	l.mu.Unlock()
	if held {
		l.log.Info().Str("lease", l.key).Msg("released the lease")
		l.onChange(false)
	}
}
