package devforge_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/devforge"
)

// needTools returns the cached binaries, skipping the test (failing it in CI) when they have not
// been built.
func needTools(t *testing.T) devforge.Tools {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test with a real Gitea; run without -short")
	}
	tools, err := devforge.FindTools()
	if errors.Is(err, devforge.ErrToolsMissing) && os.Getenv("CI") == "" {
		t.Skip(err) // names the command that builds them
	}
	require.NoError(t, err)
	return tools
}

// logWriter forwards a child's output to t.Log, line by line, until the test ends.
type logWriter struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	buf    []byte
	done   bool
}

func newLogWriter(t *testing.T, prefix string) *logWriter {
	w := &logWriter{t: t, prefix: prefix}
	// Registered before the component's Close, so it runs after it (cleanups run LIFO).
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return w
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Logf("%s: %s", w.prefix, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

func startForge(t *testing.T, ctx context.Context, tools devforge.Tools, dir string) *devforge.Forge {
	t.Helper()
	out := newLogWriter(t, "gitea")
	began := time.Now()
	forge, err := devforge.Start(ctx, tools, devforge.Options{Dir: dir, Output: out})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, forge.Close(), "close forge")
	})
	t.Logf("gitea started at %s in %v", forge.URL(), time.Since(began))
	return forge
}

// TestStaticRunnerJob runs a one-step job with a secret on a real gitea-runner registered at
// repository scope. Measured on the project's 2-core machine: Gitea starts in 1.7-3.9 s with a
// fresh state directory (migrate, admin user, web; the slower end with cold caches) and in
// 0.7-1.0 s on a reused one; the job completes 1.1-3.1 s after the push is sent (the push API
// call itself takes about 0.5 s).
func TestStaticRunnerJob(t *testing.T) {
	tools := needTools(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	forge := startForge(t, ctx, tools, t.TempDir())
	repo, err := forge.CreateRepo(ctx, "hello")
	require.NoError(t, err)
	const secret = "s3cr3t-Value-42"
	require.NoError(t, forge.SetSecret(ctx, repo, "X", secret))

	regToken, err := forge.RunnerRegistrationToken(ctx, repo.String())
	require.NoError(t, err)
	for _, scope := range []string{"", devforge.AdminUser} {
		tok, err := forge.RunnerRegistrationToken(ctx, scope)
		if assert.NoError(t, err, "RunnerRegistrationToken(%q)", scope) {
			assert.NotEmpty(t, tok, "RunnerRegistrationToken(%q), want a token of its own", scope)
			assert.NotEqual(t, regToken, tok, "RunnerRegistrationToken(%q), want a token of its own", scope)
		}
	}
	_, err = forge.RunnerRegistrationToken(ctx, "a/b/c")
	assert.Error(t, err, "RunnerRegistrationToken(%q) succeeded, want an error", "a/b/c")
	runner, err := devforge.StartStaticRunner(ctx, tools, forge.URL(), regToken,
		executor.Labels(assignment.BackendPod), filepath.Join(t.TempDir(), "runner"), newLogWriter(t, "runner"))
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, runner.Close(), "close runner")
	})

	runners, err := forge.Runners(ctx)
	require.NoError(t, err)
	require.Len(t, runners, 1, "runners = %+v, want one named %q", runners, runner.Name())
	require.Equal(t, runner.Name(), runners[0].Name, "runner name")

	const workflow = `name: ci
on: [push]
jobs:
  hello:
    runs-on: [self-hosted, pod]
    steps:
      - run: echo hello ${{ secrets.X }}
`
	pushed := time.Now()
	sha, err := forge.PushWorkflow(ctx, repo, ".gitea/workflows/ci.yml", workflow)
	require.NoError(t, err)
	run, err := forge.WaitRun(ctx, repo, sha)
	require.NoError(t, err)
	t.Logf("run %d finished %v after the push: %+v", run.ID, time.Since(pushed), run.Jobs)
	assert.True(t, run.Succeeded(), "run did not succeed: %+v", run)
	assert.Equal(t, sha, run.HeadSHA, "run head sha")
	job, ok := run.Job("hello")
	require.True(t, ok, "no job hello in %+v", run.Jobs)
	assert.Equal(t, runner.Name(), job.RunnerName, "job ran on")

	log, err := forge.JobLog(ctx, repo, job.ID)
	require.NoError(t, err)
	t.Logf("job log:\n%s", log)
	assert.Contains(t, log, "hello ***", "log does not contain the masked secret")
	assert.False(t, strings.Contains(log, secret), "log contains the secret in clear text")
	t.Logf("normalized:\n%s", devforge.NormalizeLog(log))

	_, err = forge.JobLog(ctx, repo, job.ID+1000)
	assert.ErrorIs(t, err, devforge.ErrNoLog, "JobLog of a missing job")
}

// TestRestartKeepsState starts Gitea twice on the same state directory: the second start skips
// migration and user creation and the admin token still works.
func TestRestartKeepsState(t *testing.T) {
	tools := needTools(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()

	first := startForge(t, ctx, tools, dir)
	_, err := first.CreateRepo(ctx, "kept")
	require.NoError(t, err)
	require.NoError(t, first.Close())
	require.NoError(t, first.Close(), "second close") // idempotent

	second := startForge(t, ctx, tools, dir)
	assert.Equal(t, first.Token(), second.Token(), "token after restart")
	var apiErr *devforge.APIError
	_, err = second.CreateRepo(ctx, "kept")
	if assert.ErrorAs(t, err, &apiErr, "create existing repo: want an APIError with status 409") {
		assert.Equal(t, 409, apiErr.Status, "create existing repo: APIError status")
	}
}
