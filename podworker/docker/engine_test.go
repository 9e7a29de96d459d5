package docker_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

// fakeEngine serves the few Engine API calls Wait makes on a unix socket: the first wait
// fails as an engine restarting would, the second answers.
func fakeEngine(t *testing.T, apiVersion string) (socket string, waits *atomic.Int32) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", socket)
	require.NoError(t, err)
	waits = new(atomic.Int32)
	id := strings.Repeat("c", 64)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_ping", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Api-Version", apiVersion)
		_, _ = w.Write([]byte("OK"))
	})
	mux.HandleFunc("POST /v1.41/containers/"+id+"/wait", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("condition") != "not-running" {
			http.Error(w, `{"message":"want condition not-running"}`, http.StatusBadRequest)
			return
		}
		if waits.Add(1) == 1 {
			http.Error(w, `{"message":"engine restarting"}`, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"StatusCode":7,"Error":null}`))
	})
	mux.HandleFunc("GET /v1.41/containers/"+id+"/json", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"Id":"` + id + `","Name":"/dynrunner-5-1","State":{"Status":"exited","Running":false,"ExitCode":7,"OOMKilled":true}}`))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return socket, waits
}

func TestWaitRetriesTransientEngineErrors(t *testing.T) {
	socket, waits := fakeEngine(t, "1.41")
	b := newBackend(t, "sha256:"+strings.Repeat("ab", 32), t.TempDir(), testScope(t), func(c *docker.Config) { c.Socket = "unix://" + socket })
	h := podworker.Handle{Backend: "docker", ID: "dynrunner-5-1", Task: 5, Epoch: 1, Data: map[string]string{"container_id": strings.Repeat("c", 64)}}
	exit, err := b.Wait(ctxT(t), h)
	require.NoError(t, err, "Wait")
	assert.Equal(t, podworker.Exit{Code: 7, Reason: "oom"}, exit, "Wait")
	assert.EqualValues(t, 2, waits.Load(), "wait calls: one failed, one answered")
}

func TestWaitOnUnreachableEngineEndsWithContext(t *testing.T) {
	b := newBackend(t, "sha256:"+strings.Repeat("ab", 32), t.TempDir(), testScope(t), func(c *docker.Config) {
		c.Socket = filepath.Join(t.TempDir(), "absent.sock")
	})
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	h := podworker.Handle{Backend: "docker", ID: "dynrunner-5-1", Task: 5, Epoch: 1}
	_, err := b.Wait(ctx, h)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "Wait with the engine unreachable retries until the context ends")
}

func TestRefusesOldEngine(t *testing.T) {
	socket, _ := fakeEngine(t, "1.40")
	b := newBackend(t, "sha256:"+strings.Repeat("ab", 32), t.TempDir(), testScope(t), func(c *docker.Config) { c.Socket = socket })
	assert.ErrorIs(t, b.Check(ctxT(t)), docker.ErrEngineTooOld, "Check against API 1.40")
}
