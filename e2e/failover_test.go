package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/gitea"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// envValue is the value of key in a process's environment (the last one wins, as in exec).
func envValue(c *controller, key string) string {
	v := ""
	for _, kv := range c.env {
		if s, ok := strings.CutPrefix(kv, key+"="); ok {
			v = s
		}
	}
	return v
}

// TestEnvironmentSurvivesItsFacadeHostKilled: two facades serve one control plane, a
// controller (scheduler, pod worker, facade, embedded NATS) and a second process with the
// facade alone. Environments are given both (RUNNER_FACADE_URL, the facade-only process
// first). A job registers at the facade-only process, which is SIGKILLed while the job logs;
// the environment fails over to the controller's facade and the job ends successfully in
// Gitea with its complete log, in order.
func TestEnvironmentSurvivesItsFacadeHostKilled(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "failover")
	require.NoError(t, err)

	// Both processes act as one registered runner and share the keys.
	secrets := filepath.Join(t.TempDir(), "secrets")
	require.NoError(t, os.MkdirAll(secrets, 0o700))
	tok, err := f.RunnerRegistrationToken(ctx, "")
	require.NoError(t, err)
	creds, err := gitea.Register(ctx, http.DefaultClient, f.URL(), tok, "dynrunner-failover", []string{"self-hosted", "pod"}, "e2e")
	require.NoError(t, err)
	for name, data := range map[string]string{"runner-uuid": creds.UUID, "runner-token": creds.Token, "task.key": randomKey(t), "capability.key": randomKey(t)} {
		require.NoError(t, secretfile.WriteNew(filepath.Join(secrets, name), []byte(data)))
	}
	shared := []string{
		"GITEA_RUNNER_REGISTRATION_TOKEN_FILE=",
		"GITEA_RUNNER_UUID_FILE=" + filepath.Join(secrets, "runner-uuid"),
		"GITEA_RUNNER_TOKEN_FILE=" + filepath.Join(secrets, "runner-token"),
		"TASK_ENCRYPTION_KEY_FILE=" + filepath.Join(secrets, "task.key"),
		"RUNNER_FACADE_CAPABILITY_KEY_FILE=" + filepath.Join(secrets, "capability.key"),
		leaseEnv, pickupEnv,
	}
	portA, portB := freePort(t), freePort(t)
	facades := fmt.Sprintf("RUNNER_FACADE_URL=https://127.0.0.1:%d,https://127.0.0.1:%d", portB, portA)

	a := newController(t, tools, f, repo.String(), append(shared, facades, fmt.Sprintf("RUNNER_FACADE_LISTEN=127.0.0.1:%d", portA))...)
	a.start()

	// b: the facade alone, on a's NATS and a's development CA.
	dirB := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dirB, "state"), 0o700))
	require.NoError(t, os.Symlink(filepath.Join(stateDir(a), "ca"), filepath.Join(dirB, "state", "ca")))
	httpB := freePort(t)
	b := &controller{t: t, httpURL: fmt.Sprintf("http://127.0.0.1:%d", httpB), logPath: filepath.Join(dirB, "facade.log")}
	b.env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"COMPONENTS=facade",
		"STATE_DIR=" + filepath.Join(dirB, "state"),
		"GITEA_URL=" + f.URL(),
		"NATS_URL=nats://" + envValue(a, "NATS_EMBEDDED_LISTEN"),
		"NATS_USER=dynrunner",
		"NATS_PASSWORD_FILE=" + filepath.Join(stateDir(a), "nats.password"),
		fmt.Sprintf("HTTP_LISTEN=127.0.0.1:%d", httpB),
		fmt.Sprintf("RUNNER_FACADE_LISTEN=127.0.0.1:%d", portB),
		facades,
	}, shared...)
	t.Cleanup(func() {
		b.stop()
		raceCheck(t, "facade", b.logPath)
		if t.Failed() {
			if data, err := os.ReadFile(b.logPath); err == nil {
				t.Logf("facade log:\n%s", tail(string(data), 80))
			}
		}
	})
	b.start()

	const lines = 400
	wf := fmt.Sprintf(`name: failover
on: [push]
jobs:
  survive:
    runs-on: [self-hosted, pod]
    steps:
      - run: for i in $(seq 1 %d); do echo "count $i"; sleep 0.05; done
      - run: echo "second step done"
`, lines)
	sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/failover.yml", wf)
	require.NoError(t, err)

	// The environment registered at b (first in its list) and logs through it: kill b.
	waitLogged(t, f, repo, sha, "count 20\n", 2*time.Minute)
	logB, err := os.ReadFile(b.logPath)
	require.NoError(t, err)
	require.Contains(t, string(logB), "environment registered", "the environment did not register at the first facade of its list")
	require.NotContains(t, runningLog(t, f, repo, sha), fmt.Sprintf("count %d\n", lines), "the job ended before the kill")
	b.kill()
	t.Log("the environment's facade SIGKILLed while the job runs")
	// The executor says so while its environment exists.
	deadline := time.Now().Add(time.Minute)
	for !executorLogged(stateDir(a), "failing over to the next") {
		if time.Now().After(deadline) {
			require.Fail(t, "no executor logged a failover within a minute of the kill")
		}
		time.Sleep(100 * time.Millisecond)
	}

	run := waitRun(t, f, repo, sha, 5*time.Minute)
	require.Len(t, run.Jobs, 1, "run: %+v", run.Jobs)
	require.EqualValues(t, "success", run.Jobs[0].Conclusion, "run: %+v", run.Jobs)
	log, err := f.JobLog(ctx, repo, run.Jobs[0].ID)
	require.NoError(t, err)
	counts := lineRe.FindAllStringSubmatch(devforge.NormalizeLog(log), -1)
	require.Len(t, counts, lines, "log holds %d count lines, want exactly %d (complete, none twice)", len(counts), lines)
	for i, m := range counts {
		require.Equal(t, fmt.Sprint(i+1), m[1], "count line %d: log out of order or duplicated", i+1)
	}
	assert.Contains(t, log, "second step done")
	// The end was recorded by the facade that remained. The facade records it after Gitea took
	// the final report, so Gitea may show the run done a moment before the record exists.
	assert.Eventually(t, func() bool {
		logA, err := os.ReadFile(a.logPath)
		return err == nil && strings.Contains(string(logA), "job completed")
	}, 30*time.Second, 100*time.Millisecond, "the controller's facade did not record the end")
	assertNoEnvironmentsLeft(t, a)
}

// executorLogged reports whether an executor log of the local backend under state holds text.
func executorLogged(state, text string) bool {
	logs, _ := filepath.Glob(filepath.Join(state, "envs", "*", "executor.log"))
	for _, l := range logs {
		if data, err := os.ReadFile(l); err == nil && strings.Contains(string(data), text) {
			return true
		}
	}
	return false
}
