package autoscale

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// engine is an in-memory Engine: containers that start as running and go when removed.
type engine struct {
	mu      sync.Mutex
	n       int
	byName  map[string]Container
	removed []string
}

func (e *engine) List(context.Context) ([]Container, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Container
	for _, c := range e.byName {
		out = append(out, c)
	}
	return out, nil
}

func (e *engine) Start(context.Context) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	name := fmt.Sprintf("w%d", e.n)
	e.byName[name] = Container{Name: name, Host: name, Running: true, Created: time.Now()}
	return name, nil
}

func (e *engine) Remove(_ context.Context, name string, _ time.Duration) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.byName, name)
	e.removed = append(e.removed, name)
	return nil
}

// TestRoundDrainsBeforeRemoving runs Actuator.Round over real JetStream (heartbeats, cordons
// and live assignments as the workers and scheduler write them) and an in-memory engine: it
// starts workers for queued work, cordons a surplus worker once the work is gone, keeps it
// while its heartbeat shows work in flight, and removes it only once that heartbeat says it
// drains with nothing in flight.
func TestRoundDrainsBeforeRemoving(t *testing.T) {
	l, _, js := eventlogtest.OpenJetStream(t)
	ctx := t.Context()
	eng := &engine{byName: map[string]Container{}}
	reg := prometheus.NewRegistry()
	held := true
	var live []assignment.State // the live assignments, as the scheduler records them
	readFleet := func(ctx context.Context) (fleet.Report, error) {
		records, _, err := fleet.ReadComponents(ctx, js)
		return fleet.Build(records, live, time.Now()), err
	}
	a := New(Config{Policy: Policy{Max: 3, Cooldown: time.Minute}, Engine: eng, Fleet: readFleet, Cordons: l.Cordons(),
		PerWorker: 2, Held: func() bool { return held }, Actor: "autoscale@test", Log: zerolog.Nop(), Registerer: reg})

	now := time.Now()
	beat := func(host string, inFlight int, draining bool, at time.Time) string {
		r := liveness.Record{Kind: liveness.KindPodWorker, Instance: host + "/1/ab", Host: host, Version: "test", StartedAt: now, LastBeat: at,
			Worker: &liveness.WorkerInfo{Capacity: 2, InFlight: inFlight, Draining: draining}}
		b, err := json.Marshal(r)
		require.NoError(t, err)
		_, err = l.Components().Put(ctx, r.Key(), b)
		require.NoError(t, err)
		return r.Key()
	}

	// Idle and empty: nothing to do.
	s, err := a.Round(ctx, now)
	require.NoError(t, err)
	assert.True(t, s.Empty(), s.Reason)

	// Three jobs queued for the pod tier: ceil(3/2) = 2 workers.
	for range 3 {
		live = append(live, assignment.State{Record: assignment.Record{Backend: assignment.BackendPod, Phase: assignment.Queued}})
	}
	s, err = a.Round(ctx, now)
	require.NoError(t, err)
	assert.Equal(t, 2, s.Start, s.Reason)
	require.Len(t, eng.byName, 2)
	w1, w2 := beat("w1", 2, false, now), beat("w2", 1, false, now)

	// The work ends; the surplus waits a cooldown, then both are cordoned.
	live = nil
	s, err = a.Round(ctx, now.Add(2*time.Minute))
	require.NoError(t, err)
	assert.Empty(t, s.Cordon, "cordoned before the surplus lasted a cooldown: %s", s.Reason)
	s, err = a.Round(ctx, now.Add(4*time.Minute))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{w1, w2}, s.Cordon, s.Reason)
	for _, w := range []string{w1, w2} {
		_, err := liveness.GetCordon(ctx, l.Cordons(), w)
		require.NoError(t, err, "cordon of %s", w)
	}

	// A heartbeat from before the cordon proves nothing.
	beat("w2", 0, true, now.Add(3*time.Minute))
	s, err = a.Round(ctx, now.Add(4*time.Minute+30*time.Second))
	require.NoError(t, err)
	assert.Empty(t, eng.removed, "removed on a heartbeat older than its cordon: %s", s.Reason)

	// w1 still finishes a job, w2 has none: only w2 goes.
	beat("w1", 1, true, now.Add(5*time.Minute))
	beat("w2", 0, true, now.Add(5*time.Minute))
	s, err = a.Round(ctx, now.Add(5*time.Minute+time.Second))
	require.NoError(t, err)
	assert.Equal(t, []string{"w2"}, eng.removed, s.Reason)
	_, err = liveness.GetCordon(ctx, l.Cordons(), w2)
	require.ErrorIs(t, err, liveness.ErrNoCordon, "the removed worker's cordon stays")

	// Another scheduler holds the lease: this one does nothing.
	held = false
	beat("w1", 0, true, now.Add(6*time.Minute))
	runCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	a.cfg.Interval = 100 * time.Millisecond
	a.Run(runCtx)
	cancel()
	assert.Equal(t, []string{"w2"}, eng.removed, "acted without the lease")

	held = true
	s, err = a.Round(ctx, now.Add(7*time.Minute))
	require.NoError(t, err)
	assert.Equal(t, []string{"w2", "w1"}, eng.removed, s.Reason)
	assert.True(t, slices.Equal([]string{"w2", "w1"}, eng.removed))
	assert.Equal(t, 2.0, testutil.ToFloat64(a.actions.WithLabelValues("remove")))
	assert.Equal(t, 2.0, testutil.ToFloat64(a.actions.WithLabelValues("start")))

	// An operator's cordon: its worker is neither lifted back into work nor removed.
	_, err = eng.Start(ctx) // w3
	require.NoError(t, err)
	w3 := beat("w3", 0, true, now.Add(9*time.Minute))
	require.NoError(t, liveness.PutCordon(ctx, l.Cordons(), w3, liveness.Cordon{By: "drain@operator", At: now.Add(8 * time.Minute)}))
	live = append(live, assignment.State{Record: assignment.Record{Backend: assignment.BackendPod, Phase: assignment.Queued}})
	s, err = a.Round(ctx, now.Add(10*time.Minute))
	require.NoError(t, err)
	assert.Empty(t, s.Uncordon, s.Reason)
	assert.Equal(t, 1, s.Start, s.Reason)
	assert.NotContains(t, eng.removed, "w3")
}
