package executor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
)

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestGitHubEnvRoundTrip(t *testing.T) {
	want := executor.GitHubConfig{Task: assignment.SlotBase + 9, Epoch: 12, SecretsDir: "/s", WorkDir: "/w",
		RunnerBin: "/opt/actions-runner/run.sh", RunnerSHA256: "ab12", LogFormat: "console"}
	env := want.Environ()
	getenv := func(k string) string { return env[k] }
	require.True(t, executor.IsGitHub(getenv))
	got, err := executor.ParseGitHubEnv(getenv)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.NotContains(t, env, executor.EnvFacadeURL, "a GitHub slot's environment names a facade")

	_, err = executor.ParseEnv(getenv)
	require.Error(t, err, "a GitHub slot's environment parses as a Gitea one")

	gitea := executor.GitHubConfig{Task: 9, Epoch: 12, SecretsDir: "/s", WorkDir: "/w", RunnerBin: "/r", RunnerSHA256: "ab"}.Environ()
	_, err = executor.ParseGitHubEnv(func(k string) string { return gitea[k] })
	require.ErrorContains(t, err, "no GitHub slot's id")
	_, err = executor.ParseGitHubEnv(func(string) string { return "" })
	var envErr *executor.EnvError
	require.ErrorAs(t, err, &envErr)
	for _, k := range []string{executor.EnvForge, executor.EnvSecretsDir, executor.EnvWorkDir, executor.EnvGitHubRunnerBin, executor.EnvGitHubRunnerSHA256, executor.EnvTaskID, executor.EnvEpoch} {
		assert.ErrorContains(t, err, k)
	}
}

// TestRunGitHubHandsTheRunnerItsConfiguration: the runner gets its JIT configuration in
// ACTIONS_RUNNER_INPUT_JITCONFIG, not on its command line; the file is gone before the runner
// starts, and the executor's own settings are not in its environment. A runner that is not
// the pinned one does not run.
func TestRunGitHubHandsTheRunnerItsConfiguration(t *testing.T) {
	dir := t.TempDir()
	secrets, work := filepath.Join(dir, "secrets"), filepath.Join(dir, "work")
	require.NoError(t, os.Mkdir(secrets, 0o700))
	runner := filepath.Join(dir, "run.sh")
	require.NoError(t, os.WriteFile(runner, []byte(`#!/bin/sh
echo "args=[$*] jit=[$ACTIONS_RUNNER_INPUT_JITCONFIG] pwd=$(pwd)"
test -e "$SECRETS/github-jitconfig" && echo "the file is still there"
env | grep -E '^(DYNRUNNER_|GITHUB_RUNNER_)' || true
`), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(secrets, executor.JITConfigFile), []byte("eyJqaXQiOiJ4In0=\n"), 0o600))
	var out bytes.Buffer
	cfg := executor.GitHubRunConfig{
		GitHubConfig: executor.GitHubConfig{Task: assignment.SlotBase + 1, Epoch: 3, SecretsDir: secrets, WorkDir: work,
			RunnerBin: runner, RunnerSHA256: sha256File(t, runner)},
		Env:    append(os.Environ(), "SECRETS="+secrets, "DYNRUNNER_TASK_ID=1", "GITHUB_RUNNER_SHA256=x"),
		Output: &out, Log: zerolog.Nop(),
	}
	require.NoError(t, executor.RunGitHub(t.Context(), cfg))
	real, err := filepath.EvalSymlinks(work)
	require.NoError(t, err)
	assert.Contains(t, out.String(), "args=[] jit=[eyJqaXQiOiJ4In0=] pwd="+real)
	assert.NotContains(t, out.String(), "still there")
	assert.NotContains(t, out.String(), "DYNRUNNER_")
	assert.NotContains(t, out.String(), "GITHUB_RUNNER_")
	assert.NoFileExists(t, filepath.Join(secrets, executor.JITConfigFile))

	require.NoError(t, os.WriteFile(filepath.Join(secrets, executor.JITConfigFile), []byte("x"), 0o600))
	cfg.RunnerSHA256 = "00" + cfg.RunnerSHA256[2:]
	out.Reset()
	require.ErrorIs(t, executor.RunGitHub(t.Context(), cfg), executor.ErrRunnerMismatch)
	assert.Empty(t, out.String(), "a runner that is not the pinned one ran")
}

// TestRunGitHubRunsAJobWithTheStandInRunner: the executor runs the stand-in runner with a JIT
// configuration the unmodified scaleset client generated; the runner takes the job GitHub
// (the fake) assigned and reports it.
func TestRunGitHubRunsAJobWithTheStandInRunner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the stand-in runner")
	}
	dir := t.TempDir()
	bin, err := githubtest.BuildStandInRunner(dir)
	require.NoError(t, err)
	srv := githubtest.New(t, githubtest.Options{Tokens: []string{"ghp_test"}, LongPollTimeout: 200 * time.Millisecond, AssignOnAcquire: true})
	client, err := scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{
		GitHubConfigURL: srv.OrgURL("acme"), PersonalAccessToken: "ghp_test"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	set, err := client.CreateRunnerScaleSet(ctx, &scaleset.RunnerScaleSet{Name: "dynrunner-pod", RunnerGroupID: 1,
		Labels: []scaleset.Label{{Name: "self-hosted"}, {Name: "pod"}}})
	require.NoError(t, err)
	sess, err := client.MessageSessionClient(ctx, set.ID, "test")
	require.NoError(t, err)
	defer func() { _ = sess.Close(context.WithoutCancel(ctx)) }()
	job, err := srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Run: "echo hello from the job"})
	require.NoError(t, err)
	_, err = sess.AcquireJobs(ctx, []int64{job})
	require.NoError(t, err)
	jit, err := client.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: "dynrunner-pod-1"}, set.ID)
	require.NoError(t, err)

	secrets := filepath.Join(dir, "secrets")
	require.NoError(t, os.Mkdir(secrets, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(secrets, executor.JITConfigFile), []byte(jit.EncodedJITConfig), 0o600))
	var out bytes.Buffer
	require.NoError(t, executor.RunGitHub(ctx, executor.GitHubRunConfig{
		GitHubConfig: executor.GitHubConfig{Task: assignment.SlotBase + 1, Epoch: 3, SecretsDir: secrets, WorkDir: filepath.Join(dir, "work"),
			RunnerBin: bin, RunnerSHA256: sha256File(t, bin)},
		Env: os.Environ(), Output: &out, Log: zerolog.Nop(),
	}), "runner output:\n%s", out.String())
	j, err := srv.Job(job)
	require.NoError(t, err)
	assert.Equal(t, githubtest.JobCompleted, j.State)
	assert.Equal(t, "succeeded", j.Result)
	log, err := srv.JobLog(job)
	require.NoError(t, err)
	assert.Contains(t, log, "hello from the job")
}
