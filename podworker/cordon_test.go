package podworker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/liveness"
	"github.com/dynrunner/dynrunner/podworker"
)

// TestFollowCordon: a worker drains while its cordon exists, or while its process stops, and
// takes work again once the cordon is lifted; FollowCordon returns nil when its context ends.
func TestFollowCordon(t *testing.T) {
	r := newRig(t)
	w := podworker.New(podworker.Config{Actor: "worker-test", Tier: assignment.BackendPod, Concurrency: 1,
		Log: zerolog.New(zerolog.NewTestWriter(t))}, newMem(), r.log, eventlog.NewView())
	key := liveness.KindPodWorker + "." + liveness.Instance("worker-test")
	var stopping atomic.Bool
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.FollowCordon(ctx, r.log.Cordons(), key, 10*time.Millisecond, stopping.Load) }()

	require.NoError(t, liveness.PutCordon(ctx, r.log.Cordons(), key, liveness.Cordon{By: "test", At: time.Now()}))
	require.Eventually(t, w.Draining, 5*time.Second, 10*time.Millisecond, "not draining with a cordon")
	require.NoError(t, liveness.DeleteCordon(ctx, r.log.Cordons(), key))
	require.Eventually(t, func() bool { return !w.Draining() }, 5*time.Second, 10*time.Millisecond, "draining after the cordon was lifted")
	stopping.Store(true)
	require.Eventually(t, w.Draining, 5*time.Second, 10*time.Millisecond, "not draining while the process stops")

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("FollowCordon did not return within 5s of its context's end")
	}
}
