package liveness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// The component kinds, as COMPONENTS names them.
const (
	KindScheduler = "scheduler"
	KindFacade    = "facade"
	KindPodWorker = "pod-worker"
	KindVMWorker  = "vm-worker"
)

// Kinds lists every kind, in the order a report shows them.
var Kinds = []string{KindScheduler, KindFacade, KindPodWorker, KindVMWorker}

// Record is one component's heartbeat, the value of its key in the components bucket.
type Record struct {
	Kind string `json:"kind"`
	// Instance names the process, unique among the running ones (its actor, made a valid key).
	Instance  string    `json:"instance"`
	Host      string    `json:"host"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	LastBeat  time.Time `json:"last_beat"`

	// Worker is what a pod or vm worker reports; nil for the other kinds.
	Worker *WorkerInfo `json:"worker,omitempty"`
	// Scheduler is what a scheduler reports; nil for the other kinds.
	Scheduler *SchedulerInfo `json:"scheduler,omitempty"`
	// Facade is what a facade reports; nil for the other kinds.
	Facade *FacadeInfo `json:"facade,omitempty"`
}

// WorkerInfo is a pod or vm worker's load.
type WorkerInfo struct {
	// Capacity is how many environments it runs at once (POD_CONCURRENCY, VM_CONCURRENCY).
	Capacity int `json:"capacity"`
	// InFlight is how many it watches or is starting now.
	InFlight int `json:"in_flight"`
	// Draining: the worker is cordoned (`dynrunner drain`, or stopping with DRAIN_SECS): it
	// takes no new environment and finishes the ones it has; safe to remove at InFlight zero.
	Draining bool `json:"draining,omitempty"`
}

// SafeToRemove reports whether the worker may be removed without cutting a job short: it is
// draining and holds no environment.
func (w WorkerInfo) SafeToRemove() bool { return w.Draining && w.InFlight == 0 }

// SchedulerInfo is a scheduler replica's role.
type SchedulerInfo struct {
	// ReconcileLease: this replica holds the reconcile lease (it alone reconciles).
	ReconcileLease bool `json:"reconcile_lease"`
}

// FacadeInfo is where a facade serves environments.
type FacadeInfo struct {
	// URL is the facade's URL as environments dial it (RUNNER_FACADE_URL).
	URL string `json:"url"`
}

// Key is the record's key in the components bucket: <kind>.<instance>.
func (r Record) Key() string { return r.Kind + "." + r.Instance }

// MaxRecordSize bounds a record's encoding; a larger value in the bucket is refused.
const MaxRecordSize = 4 << 10

// ErrInvalid: a record (or the key it is stored under) is not a heartbeat this package writes.
var ErrInvalid = errors.New("liveness: invalid heartbeat")

// keyChars are the characters a KV key may hold.
var keyChars = regexp.MustCompile(`^[-/_=a-zA-Z0-9]+$`)

// Instance makes name (a process's actor, "host/pid/random") a valid instance: characters a
// key may not hold become '_', and dots too, so that the kind is everything before the key's
// first dot.
func Instance(name string) string {
	var b strings.Builder
	for _, c := range name {
		if c == '-' || c == '/' || c == '_' || c == '=' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Validate checks r as a record this package writes: a known kind, an instance that is a valid
// key, the info of its kind and no other.
func (r Record) Validate() error {
	known := false
	for _, k := range Kinds {
		known = known || r.Kind == k
	}
	switch {
	case !known:
		return fmt.Errorf("%w: unknown kind %q", ErrInvalid, r.Kind)
	case !keyChars.MatchString(r.Instance):
		return fmt.Errorf("%w: instance %q is not a key", ErrInvalid, r.Instance)
	case (r.Kind == KindPodWorker || r.Kind == KindVMWorker) != (r.Worker != nil),
		(r.Kind == KindScheduler) != (r.Scheduler != nil),
		(r.Kind == KindFacade) != (r.Facade != nil):
		return fmt.Errorf("%w: a %s's record with another kind's details", ErrInvalid, r.Kind)
	case r.Worker != nil && (r.Worker.Capacity < 0 || r.Worker.InFlight < 0):
		return fmt.Errorf("%w: negative capacity or in-flight count", ErrInvalid)
	}
	return nil
}

// Parse decodes and validates the record stored under key; ErrInvalid when it is not a
// heartbeat, larger than MaxRecordSize, or not the one key names.
func Parse(key string, data []byte) (Record, error) {
	if len(data) > MaxRecordSize {
		return Record{}, fmt.Errorf("%w: %s: %d bytes, at most %d", ErrInvalid, key, len(data), MaxRecordSize)
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("%w: %s: %w", ErrInvalid, key, err)
	}
	if err := r.Validate(); err != nil {
		return Record{}, fmt.Errorf("%s: %w", key, err)
	}
	if r.Key() != key {
		return Record{}, fmt.Errorf("%w: the record of %s is stored under %s", ErrInvalid, r.Key(), key)
	}
	return r, nil
}

// BeatsPerTTL is how many beats fall into the bucket's TTL: a key outlives two lost beats.
const BeatsPerTTL = 3

// Heartbeat keeps one component's record in the components bucket while Run runs.
type Heartbeat struct {
	kv    jetstream.KeyValue
	every time.Duration
	rec   Record
	fill  func(*Record)
	log   zerolog.Logger
	now   func() time.Time
}

// New returns a heartbeat that keeps rec (Kind, Instance, Host, Version and StartedAt set; its
// kind's info may be zero) in kv, whose TTL is ttl. fill, when set, updates the kind's info
// before every beat: it runs on Run's goroutine and must not block.
func New(kv jetstream.KeyValue, ttl time.Duration, rec Record, fill func(*Record), log zerolog.Logger) (*Heartbeat, error) {
	switch rec.Kind {
	case KindPodWorker, KindVMWorker:
		if rec.Worker == nil {
			rec.Worker = &WorkerInfo{}
		}
	case KindScheduler:
		if rec.Scheduler == nil {
			rec.Scheduler = &SchedulerInfo{}
		}
	case KindFacade:
		if rec.Facade == nil {
			rec.Facade = &FacadeInfo{}
		}
	}
	if err := rec.Validate(); err != nil {
		return nil, err
	}
	if ttl < BeatsPerTTL*time.Millisecond {
		return nil, fmt.Errorf("liveness: a TTL of %s is too short to beat in", ttl)
	}
	if fill == nil {
		fill = func(*Record) {}
	}
	return &Heartbeat{kv: kv, every: ttl / BeatsPerTTL, rec: rec, fill: fill, log: log, now: time.Now}, nil
}

// Run beats until ctx ends, then deletes the key and returns nil: the component is gone from
// the fleet at once. A failed beat is logged and retried at the next one; the key may expire
// meanwhile, and the next beat that succeeds brings it back.
func (h *Heartbeat) Run(ctx context.Context) error {
	t := time.NewTicker(h.every)
	defer t.Stop()
	failing := false
	for {
		if err := h.beat(ctx); err != nil && ctx.Err() == nil {
			if !failing {
				h.log.Warn().Err(err).Str("key", h.rec.Key()).Msg("heartbeat failed; `dynrunner status` may not list this component until one succeeds")
			}
			failing = true
		} else if err == nil {
			failing = false
		}
		select {
		case <-ctx.Done():
			h.leave()
			return nil
		case <-t.C:
		}
	}
}

// beat puts the record once.
func (h *Heartbeat) beat(ctx context.Context) error {
	h.fill(&h.rec)
	h.rec.LastBeat = h.now().UTC()
	data, err := json.Marshal(h.rec)
	if err != nil {
		return fmt.Errorf("liveness: encode: %w", err)
	}
	bctx, cancel := context.WithTimeout(ctx, h.every)
	defer cancel()
	if _, err := h.kv.Put(bctx, h.rec.Key(), data); err != nil {
		return fmt.Errorf("liveness: beat %s: %w", h.rec.Key(), err)
	}
	return nil
}

// leave deletes the key, within a bound of its own: the run's context has ended.
func (h *Heartbeat) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.kv.Delete(ctx, h.rec.Key()); err != nil {
		h.log.Warn().Err(err).Str("key", h.rec.Key()).Msg("could not delete the heartbeat; it expires with LIVENESS_TTL")
	}
}
