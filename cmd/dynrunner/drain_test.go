package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// TestDrainEndpoints: `dynrunner drain` and /v1/workers/{id} cordon a worker in JetStream, show
// its drain state from its heartbeat, and call it safe to remove only once it drains with
// nothing in flight; an unknown worker is a 404 that says where the ids are.
func TestDrainEndpoints(t *testing.T) {
	l, _, js := eventlogtest.OpenJetStream(t)
	p := &plane{log: zerolog.Nop(), js: js, evlog: l, actor: "host/1/ab"}
	mux := http.NewServeMux()
	p.workersHandler(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := t.Context()
	inst := liveness.Instance("worker-host/2/cd")
	beat := func(inFlight int, draining bool) {
		r := liveness.Record{Kind: liveness.KindPodWorker, Instance: inst, Host: "worker-host", LastBeat: time.Now(),
			Worker: &liveness.WorkerInfo{Capacity: 4, InFlight: inFlight, Draining: draining}}
		b, err := json.Marshal(r)
		require.NoError(t, err)
		_, err = l.Components().Put(ctx, r.Key(), b)
		require.NoError(t, err)
	}
	call := func(method, path string) (int, workerStatus) {
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var s workerStatus
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
		return resp.StatusCode, s
	}
	beat(2, false)
	id := liveness.KindPodWorker + "." + inst

	code, s := call(http.MethodGet, "/v1/workers/"+url.PathEscape(id))
	require.Equal(t, http.StatusOK, code, s.Error)
	assert.Equal(t, workerStatus{ID: id, Kind: liveness.KindPodWorker, Host: "worker-host", Capacity: 4, InFlight: 2}, withoutBeat(s))

	code, s = call(http.MethodPost, "/v1/workers/"+url.PathEscape(inst)+"/drain") // the bare instance names it too
	require.Equal(t, http.StatusOK, code, s.Error)
	assert.True(t, s.Cordoned)
	assert.False(t, s.SafeToRemove, "safe to remove with two environments in flight")
	_, err := liveness.GetCordon(ctx, l.Cordons(), id)
	require.NoError(t, err, "no cordon in JetStream")

	beat(1, true)
	_, s = call(http.MethodGet, "/v1/workers/"+url.PathEscape(id))
	assert.True(t, s.Draining)
	assert.False(t, s.SafeToRemove, "safe to remove with one environment in flight")
	beat(0, true)
	_, s = call(http.MethodGet, "/v1/workers/"+url.PathEscape(id))
	assert.True(t, s.SafeToRemove, "not safe to remove once drained")

	// The command waits for the same.
	var out bytes.Buffer
	env := map[string]string{"HTTP_LISTEN": strings.TrimPrefix(srv.URL, "http://")}
	require.NoError(t, runDrain(ctx, []string{"--wait", "5s", id}, func(k string) string { return env[k] }, &out))
	assert.Contains(t, out.String(), "safe_to_remove true")

	code, s = call(http.MethodDelete, "/v1/workers/"+url.PathEscape(id)+"/drain")
	require.Equal(t, http.StatusOK, code, s.Error)
	assert.False(t, s.Cordoned)
	assert.False(t, s.SafeToRemove, "safe to remove without a cordon: it may take work at any moment")

	code, s = call(http.MethodPost, "/v1/workers/pod-worker.nobody/drain")
	require.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, s.Error, "dynrunner status")
	err = runDrain(ctx, []string{"pod-worker.nobody"}, func(k string) string { return env[k] }, &out)
	require.ErrorContains(t, err, "404")
}

func withoutBeat(s workerStatus) workerStatus {
	s.LastBeat = time.Time{}
	return s
}

// TestSweepCordons: the cordon of a worker whose heartbeat is gone is removed at the second
// sweep that misses it; a live worker's cordon stays, and so does one whose heartbeat came back.
func TestSweepCordons(t *testing.T) {
	l, _, js := eventlogtest.OpenJetStream(t)
	ctx := t.Context()
	put := func(key string) {
		require.NoError(t, liveness.PutCordon(ctx, l.Cordons(), key, liveness.Cordon{By: "test", At: time.Now()}))
	}
	beat := func(inst string) {
		r := liveness.Record{Kind: liveness.KindPodWorker, Instance: inst, Worker: &liveness.WorkerInfo{Capacity: 1}}
		b, err := json.Marshal(r)
		require.NoError(t, err)
		_, err = l.Components().Put(ctx, r.Key(), b)
		require.NoError(t, err)
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
	missing := map[string]bool{}
	n, err := sweepCordonsOnce(ctx, js, l.Cordons(), missing)
	require.NoError(t, err)
	require.Zero(t, n, "a cordon removed at the first sweep that missed its worker")
	beat("back")
	n, err = sweepCordonsOnce(ctx, js, l.Cordons(), missing)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.True(t, has(live), "a live worker's cordon was removed")
	assert.True(t, has(back), "the cordon of a worker whose heartbeat came back was removed")
	assert.False(t, has(gone), "the cordon of a worker that is gone stays")
}
