package liveness_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

func TestStaleCordons(t *testing.T) {
	alive := func(insts ...string) []liveness.Record {
		var out []liveness.Record
		for _, i := range insts {
			out = append(out, liveness.Record{Kind: liveness.KindPodWorker, Instance: i, Worker: &liveness.WorkerInfo{}})
		}
		return out
	}
	set := func(keys ...string) map[string]bool {
		m := map[string]bool{}
		for _, k := range keys {
			m[k] = true
		}
		return m
	}
	tests := []struct {
		name        string
		cordoned    []string
		alive       []liveness.Record
		missed      map[string]bool
		wantStale   []string
		wantMissing map[string]bool
	}{
		{name: "no cordons", alive: alive("a"), missed: set("pod-worker.x"), wantMissing: set()},
		{name: "live worker's cordon stays", cordoned: []string{"pod-worker.a"}, alive: alive("a"), missed: set("pod-worker.a"), wantMissing: set()},
		{name: "missing for the first time: kept, remembered", cordoned: []string{"pod-worker.a"}, wantMissing: set("pod-worker.a")},
		{name: "missing twice in a row: stale", cordoned: []string{"pod-worker.a"}, missed: set("pod-worker.a"), wantStale: []string{"pod-worker.a"}, wantMissing: set()},
		{name: "heartbeat came back: forgotten", cordoned: []string{"pod-worker.a"}, alive: alive("a"), missed: set("pod-worker.a"), wantMissing: set()},
		{
			name: "mixed", cordoned: []string{"pod-worker.live", "pod-worker.gone", "pod-worker.new"},
			alive: alive("live"), missed: set("pod-worker.gone", "pod-worker.lifted"),
			wantStale: []string{"pod-worker.gone"}, wantMissing: set("pod-worker.new"),
		},
		{name: "a heartbeat of another kind does not keep a cordon", cordoned: []string{"vm-worker.a"}, alive: alive("a"), missed: set("vm-worker.a"), wantStale: []string{"vm-worker.a"}, wantMissing: set()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stale, missing := liveness.StaleCordons(tt.cordoned, tt.alive, tt.missed)
			assert.Equal(t, tt.wantStale, stale)
			assert.Equal(t, tt.wantMissing, missing)
		})
	}
}

// TestCordonSweeper: the cordon of a worker whose heartbeat is gone is removed at the second
// sweep that misses it; a live worker's cordon stays, and so does one whose heartbeat came back.
func TestCordonSweeper(t *testing.T) {
	l, _, js := eventlogtest.OpenJetStream(t)
	ctx := t.Context()
	put := func(key string) {
		require.NoError(t, liveness.PutCordon(ctx, l.Cordons(), key, liveness.Cordon{By: "test", At: time.Now()}))
	}
	beat := func(inst string) {
		putBeat(t, l, liveness.Record{Kind: liveness.KindPodWorker, Instance: inst, Worker: &liveness.WorkerInfo{Capacity: 1}})
	}
	has := func(key string) bool {
		_, err := liveness.GetCordon(ctx, l.Cordons(), key)
		return err == nil
	}
	live, gone, back := "pod-worker.live", "pod-worker.gone", "pod-worker.back"
	put(live)
	put(gone)
	put(back)
	beat("live")
	s := &liveness.CordonSweeper{Cordons: l.Cordons(), Components: readComponents(js)}
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a cordon removed at the first sweep that missed its worker")
	beat("back")
	n, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.True(t, has(live), "a live worker's cordon was removed")
	assert.True(t, has(back), "the cordon of a worker whose heartbeat came back was removed")
	assert.False(t, has(gone), "the cordon of a worker that is gone stays")
}
