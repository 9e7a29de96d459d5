package eventlog_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

func TestEnvironmentStream(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	env, err := l.js.Stream(ctx, eventlog.StreamEnvironments)
	require.NoError(t, err)
	asg, err := l.js.Stream(ctx, eventlog.StreamAssignments)
	require.NoError(t, err)
	got, want := env.CachedInfo().Config, asg.CachedInfo().Config
	assert.Equal(t, []string{"dynrunner.environment.*"}, got.Subjects)
	assert.Equal(t, jetstream.LimitsPolicy, got.Retention)
	assert.Equal(t, jetstream.FileStorage, got.Storage)
	assert.Equal(t, want.MaxAge, got.MaxAge, "the assignments stream's max age")
	assert.Equal(t, want.Replicas, got.Replicas, "the assignments stream's replicas")
	assert.Equal(t, want.Duplicates, got.Duplicates, "the assignments stream's duplicate window")
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
		require.NoError(t, l.RecordEnvironment(ctx, r), r.Phase)
	}

	c, err := l.js.OrderedConsumer(ctx, eventlog.StreamEnvironments, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{eventlog.EnvironmentSubject(12)},
	})
	require.NoError(t, err)
	batch, err := c.FetchNoWait(10)
	require.NoError(t, err)
	var raw []map[string]any
	var recs []eventlog.EnvironmentRecord
	for msg := range batch.Messages() {
		var m map[string]any
		var r eventlog.EnvironmentRecord
		require.NoError(t, json.Unmarshal(msg.Data(), &m))
		require.NoError(t, json.Unmarshal(msg.Data(), &r))
		raw, recs = append(raw, m), append(recs, r)
	}
	var phases []string
	for _, r := range recs {
		phases = append(phases, r.Phase)
	}
	require.Equal(t, []string{"Pending", "Running", "Failed"}, phases, "the repeated Running dropped as a duplicate")
	assert.True(t, recs[0].At.Equal(t0), "at = %v, want %v", recs[0].At, t0)
	assert.Equal(t, time.UTC, recs[0].At.Location())
	for _, k := range []string{"task_id", "epoch", "backend", "env", "pod_uid", "phase", "reason", "message", "node", "at", "actor"} {
		assert.Contains(t, raw[2], k)
	}
	assert.Equal(t, "2026-12-02T12:00:03Z", raw[2]["at"], "RFC 3339 in UTC")
	m := recs[2].Message
	assert.LessOrEqual(t, len(m), 512)
	assert.True(t, utf8.ValidString(m), "valid UTF-8")
	assert.True(t, strings.HasSuffix(m, "…"), "ends in …")

	// The audit trail of the assignment is not touched.
	asg, err := l.js.Stream(ctx, eventlog.StreamAssignments)
	require.NoError(t, err)
	info, err := asg.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, info.State.Msgs, "messages in the assignments stream")
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
			require.Error(t, err, "recorded")
			if tc.wantID {
				require.ErrorIs(t, err, assignment.ErrInvalidID)
			} else {
				require.NotErrorIs(t, err, assignment.ErrInvalidID)
			}
		})
	}
}
