package githubtest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/actions/scaleset/listener"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
)

// recordingScaler keeps as many JIT runners as the listener asks for and records what it is told.
type recordingScaler struct {
	client     *scaleset.Client
	scaleSetID int

	mu        sync.Mutex
	made      int
	finished  int
	started   []*scaleset.JobStarted
	completed []*scaleset.JobCompleted
}

func (s *recordingScaler) HandleJobStarted(_ context.Context, m *scaleset.JobStarted) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started = append(s.started, m)
	return nil
}

func (s *recordingScaler) HandleJobCompleted(_ context.Context, m *scaleset.JobCompleted) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.completed = append(s.completed, m)
	s.finished++
	return nil
}

func (s *recordingScaler) HandleDesiredRunnerCount(ctx context.Context, count int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.made-s.finished < count {
		s.made++
		_, err := s.client.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: fmt.Sprintf("slot-%d", s.made)}, s.scaleSetID)
		if err != nil {
			return 0, fmt.Errorf("scaler: generate JIT config: %w", err)
		}
	}
	return count, nil
}

func (s *recordingScaler) counts() (started, completed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.started), len(s.completed)
}

// TestLibraryListener runs the library's own listener against the fake: it acquires the job by
// itself, its scaler creates a runner for the assigned job, and it hears the job start and end.
func TestLibraryListener(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.AssignOnAcquire = true })
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)
	l, err := listener.New(sess, listener.Config{ScaleSetID: set.ID, MaxRunners: 3})
	require.NoError(t, err)
	scaler := &recordingScaler{client: c, scaleSetID: set.ID}

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(runCtx, scaler) }()

	jobID, err := srv.QueueJob(githubtest.JobSpec{Labels: podLabels})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(srv.Runners()) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the listener acquires the job and its scaler makes a runner")
	runnerID, err := srv.StartJob(jobID, 0)
	require.NoError(t, err)
	require.Eventually(t, func() bool { s, _ := scaler.counts(); return s == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, srv.CompleteJob(jobID, "succeeded"))
	require.Eventually(t, func() bool { _, c := scaler.counts(); return c == 1 }, 10*time.Second, 5*time.Millisecond)

	stop()
	select {
	case err := <-ran:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the listener did not stop")
	}
	require.NoError(t, sess.Close(ctx))

	assert.Equal(t, runnerID, scaler.started[0].RunnerID)
	assert.Equal(t, jobID, scaler.completed[0].RunnerRequestID)
	assert.Equal(t, "succeeded", scaler.completed[0].Result)
	assert.Empty(t, srv.Runners(), "the single-use runner is gone")
	assert.Zero(t, srv.PendingMessages(set.ID), "the listener acknowledged every message")
}
