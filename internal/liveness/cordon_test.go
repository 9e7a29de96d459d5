package liveness_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// TestCordon: a cordon is put, read and lifted under a worker's key; lifting none is no error;
// keys of other kinds are refused.
func TestCordon(t *testing.T) {
	l, _, _ := eventlogtest.OpenJetStream(t)
	kv, ctx := l.Cordons(), t.Context()
	key := "pod-worker." + liveness.Instance("host/1/ab")
	_, err := liveness.GetCordon(ctx, kv, key)
	require.ErrorIs(t, err, liveness.ErrNoCordon)
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	require.NoError(t, liveness.PutCordon(ctx, kv, key, liveness.Cordon{By: "scheduler@x", At: at}))
	c, err := liveness.GetCordon(ctx, kv, key)
	require.NoError(t, err)
	require.Equal(t, liveness.Cordon{By: "scheduler@x", At: at}, c)
	require.NoError(t, liveness.DeleteCordon(ctx, kv, key))
	require.NoError(t, liveness.DeleteCordon(ctx, kv, key), "lifting no cordon")
	_, err = liveness.GetCordon(ctx, kv, key)
	require.ErrorIs(t, err, liveness.ErrNoCordon)
	require.ErrorContains(t, liveness.PutCordon(ctx, kv, "scheduler.x", liveness.Cordon{}), "not a worker's key")
	require.ErrorContains(t, liveness.PutCordon(ctx, kv, "pod-worker.a b", liveness.Cordon{}), "not a worker's key")
}
