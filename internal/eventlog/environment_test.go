package eventlog_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

func TestEnvironmentStream(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	js := l.JetStream()
	env, err := js.Stream(ctx, eventlog.StreamEnvironments)
	if err != nil {
		t.Fatal(err)
	}
	asg, err := js.Stream(ctx, eventlog.StreamAssignments)
	if err != nil {
		t.Fatal(err)
	}
	got, want := env.CachedInfo().Config, asg.CachedInfo().Config
	if !reflect.DeepEqual(got.Subjects, []string{"dynrunner.environment.*"}) {
		t.Errorf("subjects = %v", got.Subjects)
	}
	if got.Retention != jetstream.LimitsPolicy || got.Storage != jetstream.FileStorage ||
		got.MaxAge != want.MaxAge || got.Replicas != want.Replicas || got.Duplicates != want.Duplicates {
		t.Errorf("config = %+v, want limits retention, file storage and the assignments stream's max age %v, replicas %d, duplicate window %v",
			got, want.MaxAge, want.Replicas, want.Duplicates)
	}
}

func TestRecordEnvironment(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	rec := func(phase string, at time.Time) eventlog.EnvironmentRecord {
		return eventlog.EnvironmentRecord{Task: 12, Epoch: 57, Backend: "kubernetes", Env: "dynrunner-12-57",
			PodUID: "0b7a2f4e-uid", Phase: phase, Node: "node-1", At: at, Actor: "pod-worker@test/1"}
	}
	local := time.FixedZone("CET", 3600)
	failed := rec(eventlog.EnvFailed, t0.Add(3*time.Second))
	failed.Reason = "DeadlineExceeded"
	failed.Message = strings.Repeat("é", 400) // 800 bytes
	for _, r := range []eventlog.EnvironmentRecord{
		rec(eventlog.EnvPending, t0.In(local)),
		rec(eventlog.EnvRunning, t0.Add(time.Second)),
		rec(eventlog.EnvRunning, t0.Add(2*time.Second)), // a resumed Wait reports it again
		failed,
	} {
		if err := l.RecordEnvironment(ctx, r); err != nil {
			t.Fatalf("RecordEnvironment(%s): %v", r.Phase, err)
		}
	}

	c, err := l.JetStream().OrderedConsumer(ctx, eventlog.StreamEnvironments, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{eventlog.EnvironmentSubject(12)},
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(10)
	if err != nil {
		t.Fatal(err)
	}
	var raw []map[string]any
	var recs []eventlog.EnvironmentRecord
	for msg := range batch.Messages() {
		var m map[string]any
		var r eventlog.EnvironmentRecord
		if err := json.Unmarshal(msg.Data(), &m); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(msg.Data(), &r); err != nil {
			t.Fatal(err)
		}
		raw, recs = append(raw, m), append(recs, r)
	}
	var phases []string
	for _, r := range recs {
		phases = append(phases, r.Phase)
	}
	if want := []string{"Pending", "Running", "Failed"}; !reflect.DeepEqual(phases, want) {
		t.Fatalf("phases = %v, want %v (the repeated Running dropped as a duplicate)", phases, want)
	}
	if got, want := recs[0].At, t0; !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("at = %v, want %v in UTC", got, want)
	}
	var keys []string
	for k := range raw[2] {
		keys = append(keys, k)
	}
	for _, k := range []string{"task_id", "epoch", "backend", "env", "pod_uid", "phase", "reason", "message", "node", "at", "actor"} {
		if _, ok := raw[2][k]; !ok {
			t.Errorf("record lacks %q; it has %v", k, keys)
		}
	}
	if got := raw[2]["at"]; got != "2026-12-02T12:00:03Z" {
		t.Errorf("at = %v, want RFC 3339 in UTC", got)
	}
	if m := recs[2].Message; len(m) > 512 || !utf8.ValidString(m) || !strings.HasSuffix(m, "…") {
		t.Errorf("message of %d bytes (valid UTF-8: %v), want at most 512 ending in …", len(m), utf8.ValidString(m))
	}

	// The audit trail of the assignment is not touched.
	asg, err := l.JetStream().Stream(ctx, eventlog.StreamAssignments)
	if err != nil {
		t.Fatal(err)
	}
	info, err := asg.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("the assignments stream holds %d messages, want 0", info.State.Msgs)
	}
}

func TestRecordEnvironmentRefusesIncomplete(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	good := eventlog.EnvironmentRecord{Task: 3, Epoch: 9, Env: "dynrunner-3-9", Phase: eventlog.EnvRunning, At: t0}
	for _, tc := range []struct {
		name   string
		edit   func(*eventlog.EnvironmentRecord)
		wantID bool
	}{
		{"no task", func(r *eventlog.EnvironmentRecord) { r.Task = 0 }, true},
		{"no epoch", func(r *eventlog.EnvironmentRecord) { r.Epoch = 0 }, true},
		{"no env", func(r *eventlog.EnvironmentRecord) { r.Env = "" }, false},
		{"no phase", func(r *eventlog.EnvironmentRecord) { r.Phase = "" }, false},
		{"no time", func(r *eventlog.EnvironmentRecord) { r.At = time.Time{} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.edit(&r)
			err := l.RecordEnvironment(t.Context(), r)
			if err == nil {
				t.Fatal("recorded")
			}
			if got := errors.Is(err, assignment.ErrInvalidID); got != tc.wantID {
				t.Fatalf("err = %v; errors.Is(ErrInvalidID) = %v, want %v", err, got, tc.wantID)
			}
		})
	}
}
