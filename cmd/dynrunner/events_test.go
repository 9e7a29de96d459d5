package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// eventsFixture starts a NATS server holding one assignment's claim (task 12) and two Pod
// phases of its environment, and returns the environment that points `dynrunner events` at it.
func eventsFixture(t *testing.T) func(string) string {
	t.Helper()
	dir := t.TempDir()
	const user, password = "dynrunner", "events-test-password"
	srv, err := natsconn.Embed(filepath.Join(dir, "js"), "127.0.0.1:-1", user, password)
	require.NoError(t, err)
	t.Cleanup(srv.WaitForShutdown)
	t.Cleanup(srv.Shutdown)
	nc, err := natsconn.Connect(natsconn.Config{URL: srv.ClientURL(), User: user, Password: password, Name: t.Name()})
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc.NC)
	require.NoError(t, err)
	ctx := t.Context()
	elCfg := eventlog.DefaultConfig()
	elCfg.Key = []byte("0123456789abcdef0123456789abcdef")
	l, err := eventlog.Open(ctx, js, elCfg)
	require.NoError(t, err)
	at := time.Date(2026, 12, 2, 13, 28, 53, 0, time.UTC)
	st, err := l.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: 12, Actor: "scheduler@test/1", At: at,
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(t, err)
	for i, phase := range []string{eventlog.EnvRunning, eventlog.EnvFailed} {
		rec := eventlog.EnvironmentRecord{Task: 12, Epoch: st.Epoch(), Backend: "kubernetes", Env: "dynrunner-12-1",
			PodUID: "uid-1", Phase: phase, Node: "node-1", At: at.Add(time.Duration(i+1) * time.Second), Actor: "pod-worker@test/1"}
		if phase == eventlog.EnvFailed {
			rec.Reason = "Error"
		}
		require.NoError(t, l.RecordEnvironment(ctx, rec))
	}
	pwFile := filepath.Join(dir, "nats.password")
	require.NoError(t, os.WriteFile(pwFile, []byte(password), 0o600))
	env := map[string]string{"NATS_URL": srv.ClientURL(), "NATS_USER": user, "NATS_PASSWORD_FILE": pwFile}
	return func(k string) string { return env[k] }
}

// TestEventsShowsEnvironments runs `dynrunner events` against a NATS server holding one
// assignment's claim and two Pod phases of its environment.
func TestEventsShowsEnvironments(t *testing.T) {
	getenv := eventsFixture(t)
	ctx := t.Context()
	events := func(t *testing.T, args ...string) []string {
		t.Helper()
		var out bytes.Buffer
		require.NoError(t, runEvents(ctx, append(args, "--follow=false"), getenv, &out), "events %v", args)
		return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	}

	t.Run("json", func(t *testing.T) {
		lines := events(t, "--json")
		require.Len(t, lines, 3)
		assert.True(t, strings.HasPrefix(lines[0], `{"seq":1,"epoch":1,"transition":"claimed",`), "assignment line = %s", lines[0])
		var got struct {
			Kind   string `json:"kind"`
			Seq    uint64 `json:"seq"`
			Phase  string `json:"phase"`
			Reason string `json:"reason"`
			Trans  string `json:"transition"`
		}
		require.NoError(t, json.Unmarshal([]byte(lines[2]), &got))
		assert.Equal(t, "environment", got.Kind)
		assert.Equal(t, uint64(2), got.Seq)
		assert.Equal(t, "Failed", got.Phase)
		assert.Equal(t, "Error", got.Reason)
		assert.Empty(t, got.Trans)
		assert.True(t, strings.HasPrefix(lines[2], `{"kind":"environment","seq":2,"task_id":12,"epoch":1,`), "environment line = %s", lines[2])
	})
	t.Run("text", func(t *testing.T) {
		lines := events(t, "--task", "12")
		want := []string{
			"2026-12-02T13:28:53Z  seq=1      task=12     epoch=1      claimed    backend=pod actor=scheduler@test/1",
			"2026-12-02T13:28:54Z  env        task=12     epoch=1      Running    env=dynrunner-12-1 backend=kubernetes actor=pod-worker@test/1 pod_uid=uid-1 node=node-1",
			`2026-12-02T13:28:55Z  env        task=12     epoch=1      Failed     env=dynrunner-12-1 backend=kubernetes actor=pod-worker@test/1 pod_uid=uid-1 node=node-1 reason="Error"`,
		}
		assert.Equal(t, want, lines)
	})
	t.Run("without environments", func(t *testing.T) {
		lines := events(t, "--environments=false")
		require.Len(t, lines, 1, "want the claim alone")
		assert.Contains(t, lines[0], "claimed")
	})
	t.Run("another task", func(t *testing.T) {
		assert.Equal(t, []string{""}, events(t, "--task", "13"), "want nothing")
	})
}

// TestFormatEventShowsTheQueue: a queued claim's line says until when it may wait; an admission
// has its own transition name.
func TestFormatEventShowsTheQueue(t *testing.T) {
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	queued := assignment.State{Seq: 7, Record: assignment.Record{Transition: assignment.Claimed, Phase: assignment.Queued,
		Task: 3, Backend: assignment.BackendPod, At: at, Repo: "acme/app", QueueDeadline: at.Add(30 * time.Minute)}}
	line := formatEvent(queued)
	require.Contains(t, line, "claimed")
	require.Contains(t, line, "queued_until=2026-12-05T12:30:00Z")
	admitted := queued
	admitted.Transition, admitted.Phase, admitted.Record.Epoch = assignment.Admitted, assignment.Claimed, 7
	require.NotContains(t, formatEvent(admitted), "queued_until")
	require.Contains(t, formatEvent(admitted), "admitted")
}

// TestFormatEventShowsGitHubSlots: a slot's line names its forge, scale set and runner, and,
// once GitHub gave the runner a job, that job; a Gitea task's line has none of it.
func TestFormatEventShowsGitHubSlots(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	slot := assignment.State{Seq: 9, Record: assignment.Record{Transition: assignment.Configured, Phase: assignment.Claimed,
		Task: assignment.SlotBase + 5, Backend: assignment.BackendVM, At: at, Forge: assignment.ForgeGitHub, ScaleSet: 2,
		RunnerName: "dynrunner-vm-5", RunnerID: 41}}
	line := formatEvent(slot)
	assert.Contains(t, line, "forge=github slot=5 scale_set=2 runner=dynrunner-vm-5 runner_id=41")
	assert.NotContains(t, line, "github_job=")
	slot.Transition, slot.Phase, slot.GitHubJob, slot.RunID, slot.Repo, slot.Job = assignment.Running, assignment.Running, "job-7", 1007, "acme/app", "build"
	assert.Contains(t, formatEvent(slot), `github_job=job-7 run=1007 repo=acme/app job="build"`)
	assert.NotContains(t, formatEvent(assignment.State{Record: assignment.Record{Task: 3, At: at}}), "forge=")
	assert.NotContains(t, formatEvent(slot), " lost")
	slot.Transition, slot.Phase, slot.Result, slot.Reason, slot.Lost = assignment.Failed, assignment.Failed, "failure", "evicted", true
	assert.Contains(t, formatEvent(slot), `result=failure lost reason="evicted"`)
}
