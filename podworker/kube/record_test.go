package kube_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/kube"
)

// recorder keeps the records RecordPhases appends, or fails each append with err.
type recorder struct {
	got []eventlog.EnvironmentRecord
	err error
}

func (r *recorder) RecordEnvironment(ctx context.Context, rec eventlog.EnvironmentRecord) error {
	if _, ok := ctx.Deadline(); !ok {
		return errors.New("no deadline on the append")
	}
	r.got = append(r.got, rec)
	return r.err
}

// TestRecordPhases: each Pod phase becomes one environment record of the handle's assignment,
// written as the actor at the clock's time; a failed append is logged, never returned.
func TestRecordPhases(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	h := podworker.Handle{Backend: "kubernetes", ID: "dynrunner-7-2", Task: assignment.TaskID(7), Epoch: assignment.Epoch(2)}
	c := kube.PhaseChange{UID: "uid-1", Phase: "Failed", Reason: "OOMKilled", Message: "m", Node: "node-1"}
	want := eventlog.EnvironmentRecord{Task: 7, Epoch: 2, Backend: "kubernetes", Env: "dynrunner-7-2", PodUID: "uid-1",
		Phase: "Failed", Reason: "OOMKilled", Message: "m", Node: "node-1", At: at, Actor: "pod-worker@test/1/abc"}
	for _, tc := range []struct {
		name    string
		err     error
		warning bool
	}{
		{"recorded", nil, false},
		{"append fails", errors.New("nats: timeout"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			rec := &recorder{err: tc.err}
			onPhase := kube.RecordPhases(rec, "pod-worker@test/1/abc", func() time.Time { return at }, zerolog.New(&logs))
			onPhase(t.Context(), h, c)
			require.Equal(t, []eventlog.EnvironmentRecord{want}, rec.got)
			require.Equal(t, tc.warning, bytes.Contains(logs.Bytes(), []byte("could not record the pod phase in the event log")))
		})
	}
}
