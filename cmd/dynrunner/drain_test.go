package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// TestDrainEndpoints: `dynrunner drain` cordons a worker through the drain API the controller
// mounts at /v1/workers/, waits until it is safe to remove, and fails on an unknown worker.
// (The API itself is tested in package liveness.)
func TestDrainEndpoints(t *testing.T) {
	l, _, js := eventlogtest.OpenJetStream(t)
	p := &plane{log: zerolog.Nop(), js: js, evlog: l, actor: "host/1/ab"}
	mux := http.NewServeMux()
	mux.Handle("/v1/workers/", p.drainAPI())
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
	id := liveness.KindPodWorker + "." + inst
	env := map[string]string{"HTTP_LISTEN": strings.TrimPrefix(srv.URL, "http://")}
	getenv := func(k string) string { return env[k] }
	var out bytes.Buffer

	beat(2, false)
	require.NoError(t, runDrain(ctx, []string{id}, getenv, &out))
	assert.Contains(t, out.String(), "cordoned true")
	assert.Contains(t, out.String(), "safe_to_remove false")
	_, err := liveness.GetCordon(ctx, l.Cordons(), id)
	require.NoError(t, err, "no cordon in JetStream")

	beat(0, true)
	out.Reset()
	require.NoError(t, runDrain(ctx, []string{"--wait", "5s", id}, getenv, &out))
	assert.Contains(t, out.String(), "safe_to_remove true")

	out.Reset()
	require.NoError(t, runDrain(ctx, []string{"--undo", id}, getenv, &out))
	assert.Contains(t, out.String(), "cordoned false")
	_, err = liveness.GetCordon(ctx, l.Cordons(), id)
	require.ErrorIs(t, err, liveness.ErrNoCordon)

	err = runDrain(ctx, []string{"pod-worker.nobody"}, getenv, &out)
	require.ErrorContains(t, err, "404")
}
