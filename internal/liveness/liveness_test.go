package liveness_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

func worker(inst string) liveness.Record {
	return liveness.Record{Kind: liveness.KindPodWorker, Instance: inst, Host: "h", Version: "v1",
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Worker: &liveness.WorkerInfo{Capacity: 4, InFlight: 1}}
}

func TestParseRoundTrip(t *testing.T) {
	for _, r := range []liveness.Record{
		worker("h/1/abc"),
		{Kind: liveness.KindScheduler, Instance: "s", Scheduler: &liveness.SchedulerInfo{ReconcileLease: true}},
		{Kind: liveness.KindFacade, Instance: "f", Facade: &liveness.FacadeInfo{URL: "https://facade:8443"}},
		{Kind: liveness.KindVMWorker, Instance: "v", Worker: &liveness.WorkerInfo{Capacity: 1}},
	} {
		data, err := json.Marshal(r)
		require.NoError(t, err)
		got, err := liveness.Parse(r.Key(), data)
		require.NoError(t, err, r.Key())
		assert.Equal(t, r, got)
	}
}

// TestParseRefuses: whoever can write the bucket chooses its values; what is not a heartbeat
// of the key it is stored under is refused.
func TestParseRefuses(t *testing.T) {
	good := worker("a")
	enc := func(r liveness.Record) []byte { b, _ := json.Marshal(r); return b }
	for _, tc := range []struct {
		name string
		key  string
		data []byte
	}{
		{"not json", "pod-worker.a", []byte("{")},
		{"unknown field", "pod-worker.a", []byte(`{"kind":"pod-worker","instance":"a","worker":{"capacity":1,"in_flight":0},"x":1}`)},
		{"unknown kind", "db.a", enc(liveness.Record{Kind: "db", Instance: "a"})},
		{"another key's record", "pod-worker.b", enc(good)},
		{"another kind's details", "scheduler.a", enc(liveness.Record{Kind: liveness.KindScheduler, Instance: "a", Worker: &liveness.WorkerInfo{}})},
		{"a worker without its load", "pod-worker.a", enc(liveness.Record{Kind: liveness.KindPodWorker, Instance: "a"})},
		{"negative load", "pod-worker.a", enc(liveness.Record{Kind: liveness.KindPodWorker, Instance: "a", Worker: &liveness.WorkerInfo{InFlight: -1}})},
		{"instance with a dot", "pod-worker.a.b", enc(liveness.Record{Kind: liveness.KindPodWorker, Instance: "a.b", Worker: &liveness.WorkerInfo{}})},
		{"oversize", "pod-worker.a", []byte(`{"kind":"pod-worker","instance":"a","host":"` + strings.Repeat("h", liveness.MaxRecordSize) + `"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := liveness.Parse(tc.key, tc.data)
			require.ErrorIs(t, err, liveness.ErrInvalid)
		})
	}
}

func TestInstance(t *testing.T) {
	assert.Equal(t, "node-1_example_org/1/0a1b2c", liveness.Instance("node-1.example.org/1/0a1b2c"))
	assert.Equal(t, "a_b", liveness.Instance("a b"))
}

// TestHeartbeatBeatsAndLeaves: a heartbeat puts its record at once, refreshes its kind's
// details, and deletes its key when it stops.
func TestHeartbeatBeatsAndLeaves(t *testing.T) {
	_, js := eventlogtest.Connect(t)
	ctx := t.Context()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "components", TTL: 30 * time.Second})
	require.NoError(t, err)
	inFlight := 0
	rec := worker("h/1/abc")
	h, err := liveness.New(kv, 300*time.Millisecond, rec, func(r *liveness.Record) { inFlight++; r.Worker.InFlight = inFlight }, zerolog.Nop())
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Run(rctx) }()

	read := func() (liveness.Record, error) {
		e, err := kv.Get(ctx, rec.Key())
		if err != nil {
			return liveness.Record{}, err
		}
		return liveness.Parse(e.Key(), e.Value())
	}
	require.Eventually(t, func() bool {
		r, err := read()
		return err == nil && r.Worker.InFlight >= 2
	}, 10*time.Second, 20*time.Millisecond, "the heartbeat does not refresh its record")
	r, err := read()
	require.NoError(t, err)
	assert.Equal(t, 4, r.Worker.Capacity)
	assert.Equal(t, "v1", r.Version)
	assert.False(t, r.LastBeat.IsZero())

	stop()
	require.NoError(t, <-done)
	_, err = read()
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a stopped heartbeat leaves its key")
}

func TestNewRefusesAnInvalidRecord(t *testing.T) {
	_, err := liveness.New(nil, time.Second, liveness.Record{Kind: "db", Instance: "a"}, nil, zerolog.Nop())
	require.ErrorIs(t, err, liveness.ErrInvalid)
}

// FuzzParse: whatever the bucket holds, an accepted value is a valid heartbeat of its key and
// survives a round trip; nothing larger than MaxRecordSize is accepted.
func FuzzParse(f *testing.F) {
	good, _ := json.Marshal(worker("h/1/abc"))
	f.Add("pod-worker.h/1/abc", good)
	f.Add("scheduler.s", []byte(`{"kind":"scheduler","instance":"s","scheduler":{"reconcile_lease":true}}`))
	f.Add("facade.f", []byte(`{"kind":"facade","instance":"f","facade":{"url":"x"}}`))
	f.Fuzz(func(t *testing.T, key string, data []byte) {
		r, err := liveness.Parse(key, data)
		if err != nil {
			require.ErrorIs(t, err, liveness.ErrInvalid)
			return
		}
		require.LessOrEqual(t, len(data), liveness.MaxRecordSize)
		require.Equal(t, key, r.Key())
		require.NoError(t, r.Validate())
		again, err := json.Marshal(r)
		require.NoError(t, err)
		back, err := liveness.Parse(key, again)
		require.NoError(t, err)
		require.Equal(t, r, back)
	})
}
