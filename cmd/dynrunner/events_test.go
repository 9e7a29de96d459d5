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

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// eventsFixture starts a NATS server holding one assignment's claim (task 12) and two Pod
// phases of its environment, and points `dynrunner events` at it through the environment.
func eventsFixture(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	const user, password = "dynrunner", "events-test-password"
	srv, err := natsconn.Embed(filepath.Join(dir, "js"), "127.0.0.1:-1", user, password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.WaitForShutdown)
	t.Cleanup(srv.Shutdown)
	nc, err := natsconn.Connect(natsconn.Config{URL: srv.ClientURL(), User: user, Password: password, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc.NC)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	elCfg := eventlog.DefaultConfig()
	elCfg.Key = []byte("0123456789abcdef0123456789abcdef")
	l, err := eventlog.Open(ctx, js, elCfg)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 13, 28, 53, 0, time.UTC)
	st, err := l.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: 12, Actor: "scheduler@test/1", At: at,
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, phase := range []string{eventlog.EnvRunning, eventlog.EnvFailed} {
		rec := eventlog.EnvironmentRecord{Task: 12, Epoch: st.Epoch(), Backend: "kubernetes", Env: "dynrunner-12-1",
			PodUID: "uid-1", Phase: phase, Node: "node-1", At: at.Add(time.Duration(i+1) * time.Second), Actor: "pod-worker@test/1"}
		if phase == eventlog.EnvFailed {
			rec.Reason = "Error"
		}
		if err := l.RecordEnvironment(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	pwFile := filepath.Join(dir, "nats.password")
	if err := os.WriteFile(pwFile, []byte(password), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("NATS_USER", user)
	t.Setenv("NATS_PASSWORD_FILE", pwFile)
}

// TestEventsShowsEnvironments runs `dynrunner events` against a NATS server holding one
// assignment's claim and two Pod phases of its environment.
func TestEventsShowsEnvironments(t *testing.T) {
	eventsFixture(t)
	ctx := t.Context()
	events := func(t *testing.T, args ...string) []string {
		t.Helper()
		var out bytes.Buffer
		if err := runEvents(ctx, append(args, "--follow=false"), &out); err != nil {
			t.Fatalf("events %v: %v", args, err)
		}
		return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	}

	t.Run("json", func(t *testing.T) {
		lines := events(t, "--json")
		if len(lines) != 3 {
			t.Fatalf("%d lines, want 3:\n%s", len(lines), strings.Join(lines, "\n"))
		}
		if !strings.HasPrefix(lines[0], `{"seq":1,"epoch":1,"transition":"claimed",`) {
			t.Errorf("assignment line = %s", lines[0])
		}
		var got struct {
			Kind   string `json:"kind"`
			Seq    uint64 `json:"seq"`
			Phase  string `json:"phase"`
			Reason string `json:"reason"`
			Trans  string `json:"transition"`
		}
		if err := json.Unmarshal([]byte(lines[2]), &got); err != nil {
			t.Fatal(err)
		}
		if got.Kind != "environment" || got.Seq != 2 || got.Phase != "Failed" || got.Reason != "Error" || got.Trans != "" ||
			!strings.HasPrefix(lines[2], `{"kind":"environment","seq":2,"task_id":12,"epoch":1,`) {
			t.Errorf("environment line = %s", lines[2])
		}
	})
	t.Run("text", func(t *testing.T) {
		lines := events(t, "--task", "12")
		want := []string{
			"2026-12-02T13:28:53Z  seq=1      task=12     epoch=1      claimed    backend=pod actor=scheduler@test/1",
			"2026-12-02T13:28:54Z  env        task=12     epoch=1      Running    env=dynrunner-12-1 backend=kubernetes actor=pod-worker@test/1 pod_uid=uid-1 node=node-1",
			`2026-12-02T13:28:55Z  env        task=12     epoch=1      Failed     env=dynrunner-12-1 backend=kubernetes actor=pod-worker@test/1 pod_uid=uid-1 node=node-1 reason="Error"`,
		}
		if got := strings.Join(lines, "\n"); got != strings.Join(want, "\n") {
			t.Errorf("got:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
		}
	})
	t.Run("without environments", func(t *testing.T) {
		if lines := events(t, "--environments=false"); len(lines) != 1 || !strings.Contains(lines[0], "claimed") {
			t.Errorf("got %q, want the claim alone", lines)
		}
	})
	t.Run("another task", func(t *testing.T) {
		if lines := events(t, "--task", "13"); len(lines) != 1 || lines[0] != "" {
			t.Errorf("got %q, want nothing", lines)
		}
	})
}
