package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
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
	srv := httptest.NewServer(statusHandler(statusReport{Version: "v9", Components: []string{"scheduler", "pod-worker"}, PodBackend: "local"}, &ready, warns, nil))
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

// TestStatusCommandShowsTheFleet: a controller's /status carries the fleet; the command prints
// its table and fails, after printing, when no facade is alive.
func TestStatusCommandShowsTheFleet(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	components := []liveness.Record{
		{Kind: liveness.KindScheduler, Instance: "s1/7/aa", Host: "s1", Version: "v9", StartedAt: at.Add(-time.Hour), LastBeat: at.Add(-2 * time.Second),
			Scheduler: &liveness.SchedulerInfo{ReconcileLease: true}},
		{Kind: liveness.KindPodWorker, Instance: "p1/8/bb", Host: "p1", Version: "v9", StartedAt: at.Add(-time.Hour), LastBeat: at,
			Worker: &liveness.WorkerInfo{Capacity: 4, InFlight: 1}},
	}
	live := []assignment.State{{Record: assignment.Record{Task: 1, Backend: assignment.BackendPod, Phase: assignment.Running}}}
	fleetOf := func(context.Context) (fleet.Report, error) { return fleet.Build(components, live, at), nil }
	srv := httptest.NewServer(statusHandler(statusReport{Version: "v9", Components: []string{"scheduler", "pod-worker"}}, &ready, &bootWarnings{}, fleetOf))
	defer srv.Close()
	getenv := func(k string) string {
		if k == "HTTP_LISTEN" {
			return strings.TrimPrefix(srv.URL, "http://")
		}
		return ""
	}

	var out bytes.Buffer
	err := runStatus(t.Context(), nil, getenv, &out)
	require.ErrorIs(t, err, fleet.ErrIncomplete)
	assert.ErrorContains(t, err, "no facade is alive")
	assert.Contains(t, out.String(), "1 scheduler, 0 facade, 1 pod-worker, 0 vm-worker")
	assert.Regexp(t, `scheduler +s1 +s1/7/aa +v9 +1h0m0s +2s ago +holds the reconcile lease`, out.String())
	assert.Regexp(t, `pod-worker +p1 +p1/8/bb +v9 +1h0m0s +0s ago +1/4 in flight`, out.String())
	assert.Contains(t, out.String(), "live work: 1 assignments\n  pod: 1 (running 1)\n")
	assert.Contains(t, out.String(), "NOT WORKING: no facade is alive")

	out.Reset()
	require.ErrorIs(t, runStatus(t.Context(), []string{"--json"}, getenv, &out), fleet.ErrIncomplete)
	var got statusReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &got))
	require.NotNil(t, got.Fleet)
	assert.Equal(t, []string{liveness.KindFacade}, got.Fleet.Missing)
	assert.Equal(t, components, got.Fleet.Components)
	assert.Equal(t, 1, got.Fleet.Live.ByTierPhase[assignment.BackendPod][assignment.Running])
}

// TestStatusShowsGitHubSlots: the text status counts the GitHub slots among the live work and
// how many of them run a job.
func TestStatusShowsGitHubSlots(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	slot := func(n int, phase assignment.Phase) assignment.State {
		return assignment.State{Record: assignment.Record{Task: assignment.SlotBase + assignment.TaskID(n), Backend: assignment.BackendPod,
			Phase: phase, Forge: assignment.ForgeGitHub, ScaleSet: 1, RunnerName: "dynrunner-pod"}}
	}
	states := []assignment.State{
		{Record: assignment.Record{Task: 7, Backend: assignment.BackendPod, Phase: assignment.Running}},
		slot(1, assignment.Running), slot(2, assignment.Started), slot(3, assignment.Claimed),
	}
	var out bytes.Buffer
	require.NoError(t, printFleet(&out, fleet.Build(nil, states, at)))
	assert.Contains(t, out.String(), "live work: 4 assignments\n  pod: 4 (claimed 1, running 2, started 1)\n"+
		"  of which GitHub slots: 3 (1 running a job GitHub gave their runner, 2 waiting for one or ending)\n")

	out.Reset()
	require.NoError(t, printFleet(&out, fleet.Build(nil, states[:1], at)))
	assert.NotContains(t, out.String(), "GitHub")
}
