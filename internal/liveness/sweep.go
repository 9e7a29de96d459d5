package liveness

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/clock"
)

// StaleCordons decides which cordons to remove: a cordon names one worker process (its
// heartbeat key holds its pid and a random part), so once that process has no heartbeat its
// cordon can never apply again. Given the cordoned workers' keys, the heartbeats alive now and
// the keys whose heartbeat was missing at the previous sweep (missed), it returns the cordons
// whose worker is missing now and was then (stale), and the keys missing now for the first
// time (missing, the next sweep's missed). A heartbeat that lapsed for one sweep does not lift
// a drain.
func StaleCordons(cordoned []string, alive []Record, missed map[string]bool) (stale []string, missing map[string]bool) {
	live := map[string]bool{}
	for _, r := range alive {
		live[r.Key()] = true
	}
	missing = map[string]bool{}
	for _, k := range cordoned {
		switch {
		case live[k]:
		case missed[k]:
			stale = append(stale, k)
		default:
			missing[k] = true
		}
	}
	return stale, missing
}

// CordonSweeper removes the cordons of workers that are gone (StaleCordons) from the cordons
// bucket (eventlog.BucketCordons), every Every while Held reports true: only the scheduler
// holding the reconcile lease sweeps.
type CordonSweeper struct {
	// Cordons is the cordons bucket.
	Cordons jetstream.KeyValue
	// Components reads the heartbeats alive (fleet.ReadComponents).
	Components func(context.Context) ([]Record, error)
	// Held reports whether this process may sweep.
	Held func() bool
	// Every is the time between sweeps (LIVENESS_TTL).
	Every time.Duration
	// Log receives what the sweeps removed, and their failures.
	Log zerolog.Logger

	missed map[string]bool
}

// Run sweeps until ctx ends, and returns nil then.
func (s *CordonSweeper) Run(ctx context.Context) error {
	for clock.Sleep(ctx, s.Every) == nil {
		if !s.Held() {
			clear(s.missed)
			continue
		}
		n, err := s.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			s.Log.Warn().Err(err).Msg("sweep the cordons of workers that are gone")
		} else if n > 0 {
			s.Log.Info().Int("removed", n).Msg("removed the cordons of workers that are gone")
		}
	}
	return nil
}

// Sweep deletes the cordons whose worker had no heartbeat now and at the previous Sweep, and
// returns how many it deleted. A sweep that fails leaves what the previous one saw missing.
func (s *CordonSweeper) Sweep(ctx context.Context) (int, error) {
	keys, err := s.Cordons.ListKeys(ctx)
	if err != nil {
		return 0, err
	}
	var cordoned []string
	for k := range keys.Keys() {
		cordoned = append(cordoned, k)
	}
	if len(cordoned) == 0 {
		s.missed = nil
		return 0, nil
	}
	records, err := s.Components(ctx)
	if err != nil {
		return 0, err
	}
	stale, missing := StaleCordons(cordoned, records, s.missed)
	for i, k := range stale {
		if err := DeleteCordon(ctx, s.Cordons, k); err != nil {
			return i, err
		}
	}
	s.missed = missing
	return len(stale), nil
}
