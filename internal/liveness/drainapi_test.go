package liveness_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

func readComponents(js jetstream.JetStream) func(context.Context) ([]liveness.Record, error) {
	return func(ctx context.Context) ([]liveness.Record, error) {
		records, _, err := fleet.ReadComponents(ctx, js)
		return records, err
	}
}

// putBeat puts r's heartbeat into the components bucket.
func putBeat(t *testing.T, l *eventlog.Log, r liveness.Record) {
	t.Helper()
	b, err := json.Marshal(r)
	require.NoError(t, err)
	_, err = l.Components().Put(t.Context(), r.Key(), b)
	require.NoError(t, err)
}

func TestFindWorker(t *testing.T) {
	worker := func(kind, inst string) liveness.Record {
		return liveness.Record{Kind: kind, Instance: inst, Worker: &liveness.WorkerInfo{Capacity: 1}}
	}
	pod, vm := worker(liveness.KindPodWorker, "a"), worker(liveness.KindVMWorker, "a")
	other := worker(liveness.KindPodWorker, "b")
	sched := liveness.Record{Kind: liveness.KindScheduler, Instance: "c", Scheduler: &liveness.SchedulerInfo{}}
	tests := []struct {
		name    string
		records []liveness.Record
		id      string
		want    liveness.Record
		wantErr error
	}{
		{name: "by key", records: []liveness.Record{pod, vm, other}, id: "vm-worker.a", want: vm},
		{name: "by the instance of one worker", records: []liveness.Record{pod, other}, id: "a", want: pod},
		{name: "an instance of two workers", records: []liveness.Record{pod, vm}, id: "a", wantErr: liveness.ErrSeveralWorkers},
		{name: "no such worker", records: []liveness.Record{pod}, id: "pod-worker.z", wantErr: liveness.ErrNoWorker},
		{name: "not a worker", records: []liveness.Record{sched}, id: "scheduler.c", wantErr: liveness.ErrNoWorker},
		{name: "no heartbeats", id: "a", wantErr: liveness.ErrNoWorker},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := liveness.FindWorker(tt.records, tt.id)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestStatusOf(t *testing.T) {
	r := func(inFlight int, draining bool) liveness.Record {
		return liveness.Record{Kind: liveness.KindPodWorker, Instance: "a", Host: "h",
			Worker: &liveness.WorkerInfo{Capacity: 4, InFlight: inFlight, Draining: draining}}
	}
	cordon := &liveness.Cordon{By: "test"}
	tests := []struct {
		name                   string
		rec                    liveness.Record
		cordon                 *liveness.Cordon
		cordoned, draining, ok bool
	}{
		{name: "not cordoned", rec: r(2, false)},
		{name: "cordoned, not draining yet", rec: r(2, false), cordon: cordon, cordoned: true},
		{name: "cordoned, draining with work", rec: r(1, true), cordon: cordon, cordoned: true, draining: true},
		{name: "cordoned and drained", rec: r(0, true), cordon: cordon, cordoned: true, draining: true, ok: true},
		{name: "drained without a cordon: may take work at any moment", rec: r(0, true), draining: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := liveness.StatusOf(tt.rec, tt.cordon)
			assert.Equal(t, liveness.WorkerStatus{ID: "pod-worker.a", Kind: liveness.KindPodWorker, Host: "h", Capacity: 4,
				InFlight: tt.rec.Worker.InFlight, Cordoned: tt.cordoned, Draining: tt.draining, SafeToRemove: tt.ok}, got)
		})
	}
}

// TestDrainHandler: /v1/workers/{id} cordons a worker in JetStream, shows its drain state from
// its heartbeat, and calls it safe to remove only once it drains with nothing in flight; an
// unknown worker is a 404 that says where the ids are, an ambiguous one a 409.
func TestDrainHandler(t *testing.T) {
	l, _, js := eventlogtest.OpenJetStream(t)
	srv := httptest.NewServer(liveness.DrainHandler(liveness.DrainAPI{
		Cordons: l.Cordons(), Components: readComponents(js), Actor: "host/1/ab", Log: zerolog.Nop(),
	}))
	t.Cleanup(srv.Close)
	ctx := t.Context()
	inst := liveness.Instance("worker-host/2/cd")
	beat := func(kind string, inFlight int, draining bool) {
		putBeat(t, l, liveness.Record{Kind: kind, Instance: inst, Host: "worker-host", LastBeat: time.Now(),
			Worker: &liveness.WorkerInfo{Capacity: 4, InFlight: inFlight, Draining: draining}})
	}
	call := func(method, path string) (int, liveness.WorkerStatus) {
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var s liveness.WorkerStatus
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
		return resp.StatusCode, s
	}
	beat(liveness.KindPodWorker, 2, false)
	id := liveness.KindPodWorker + "." + inst

	code, s := call(http.MethodGet, "/v1/workers/"+url.PathEscape(id))
	require.Equal(t, http.StatusOK, code, s.Error)
	s.LastBeat = time.Time{}
	assert.Equal(t, liveness.WorkerStatus{ID: id, Kind: liveness.KindPodWorker, Host: "worker-host", Capacity: 4, InFlight: 2}, s)

	code, s = call(http.MethodPost, "/v1/workers/"+url.PathEscape(inst)+"/drain") // the bare instance names it too
	require.Equal(t, http.StatusOK, code, s.Error)
	assert.True(t, s.Cordoned)
	assert.False(t, s.SafeToRemove, "safe to remove with two environments in flight")
	c, err := liveness.GetCordon(ctx, l.Cordons(), id)
	require.NoError(t, err, "no cordon in JetStream")
	assert.Equal(t, "host/1/ab", c.By)

	beat(liveness.KindPodWorker, 1, true)
	_, s = call(http.MethodGet, "/v1/workers/"+url.PathEscape(id))
	assert.True(t, s.Draining)
	assert.False(t, s.SafeToRemove, "safe to remove with one environment in flight")
	beat(liveness.KindPodWorker, 0, true)
	_, s = call(http.MethodGet, "/v1/workers/"+url.PathEscape(id))
	assert.True(t, s.SafeToRemove, "not safe to remove once drained")

	code, s = call(http.MethodDelete, "/v1/workers/"+url.PathEscape(id)+"/drain")
	require.Equal(t, http.StatusOK, code, s.Error)
	assert.False(t, s.Cordoned)
	assert.False(t, s.SafeToRemove, "safe to remove without a cordon: it may take work at any moment")
	_, err = liveness.GetCordon(ctx, l.Cordons(), id)
	require.ErrorIs(t, err, liveness.ErrNoCordon)

	code, s = call(http.MethodPost, "/v1/workers/pod-worker.nobody/drain")
	require.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, s.Error, "dynrunner status")

	beat(liveness.KindVMWorker, 0, false)
	code, s = call(http.MethodPost, "/v1/workers/"+url.PathEscape(inst)+"/drain")
	require.Equal(t, http.StatusConflict, code, "an instance with a pod and a vm worker")
	assert.Contains(t, s.Error, "several workers")
}
