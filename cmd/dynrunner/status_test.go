package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/podworker/local"
)

func TestLocalUsers(t *testing.T) {
	cfg := config.Controller{Local: config.LocalPod{UIDBase: 2_000_000_000, UIDCount: 64}}
	tests := []struct {
		name    string
		euid    int
		want    *local.Users
		warning []string
	}{
		{"root: a uid per environment", 0, &local.Users{First: 2_000_000_000, Count: 64}, nil},
		{"not root: the controller's user, said loudly", 1000, nil, []string{"not root", "uid 1000", "can read its secrets"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, warning := localUsers(cfg, tt.euid)
			assert.Equal(t, tt.want, got)
			if tt.warning == nil {
				assert.Empty(t, warning)
			}
			for _, w := range tt.warning {
				assert.Contains(t, warning, w)
			}
		})
	}
}

func TestStatusCommandShowsWarnings(t *testing.T) {
	var ready atomic.Bool
	warns := &bootWarnings{}
	_, warning := localUsers(config.Controller{}, 1000)
	warns.warn(zerolog.Nop(), warning)
	srv := httptest.NewServer(statusHandler(statusReport{Version: "v9", Components: []string{"scheduler", "pod-worker"}, PodBackend: "local"}, &ready, warns))
	defer srv.Close()
	getenv := func(k string) string {
		if k == "HTTP_LISTEN" {
			return strings.TrimPrefix(srv.URL, "http://")
		}
		return ""
	}

	var out bytes.Buffer
	require.NoError(t, runStatus(t.Context(), nil, getenv, &out))
	assert.Contains(t, out.String(), "dynrunner controller v9: not ready\n")
	assert.Contains(t, out.String(), "pod backend: local\n")
	assert.Contains(t, out.String(), "WARNING: "+warning+"\n")

	ready.Store(true)
	out.Reset()
	require.NoError(t, runStatus(t.Context(), []string{"--json"}, getenv, &out))
	var got statusReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &got))
	assert.Equal(t, statusReport{Version: "v9", Components: []string{"scheduler", "pod-worker"}, PodBackend: "local", Ready: true, Warnings: []string{warning}}, got)

	srv.Close()
	assert.ErrorContains(t, runStatus(t.Context(), nil, getenv, &out), "no controller answers")
}

func TestOpenStateDir(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "envs"), 0o711))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nats.password"), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes"), []byte("x"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "jetstream"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(dir, "jetstream"), 0o755))
	require.NoError(t, openStateDir(dir, zerolog.Nop()))
	for name, want := range map[string]os.FileMode{
		".": 0o711, "envs": 0o711, "nats.password": 0o600, "notes": 0o640, "jetstream": 0o750,
	} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, want, fi.Mode().Perm(), name)
	}
}
