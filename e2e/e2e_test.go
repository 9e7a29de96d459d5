package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/devforge"
)

// The lease in these tests is 90 s, renewed every 30 s; the quiet job is silent for longer.
const leaseEnv = "LEASE_SECS=90"

// pickupEnv is the floor; it must stay below the lease.
const pickupEnv = "PICKUP_SECS=60"

const secretValue = "e2e-secret-value-7f3a"

const workflow = `name: e2e
on: [push]
jobs:
  produce:
    runs-on: [self-hosted, pod]
    outputs:
      value: ${{ steps.gen.outputs.value }}
    steps:
      - id: gen
        run: echo "value=from-produce" >> "$GITHUB_OUTPUT"
      - run: echo "the secret is ${{ secrets.E2E_SECRET }}"
  consume:
    needs: produce
    runs-on: [self-hosted, pod]
    steps:
      - run: echo "got ${{ needs.produce.outputs.value }}"
  matrix:
    runs-on: [self-hosted, pod]
    strategy:
      matrix:
        n: [1, 2]
    steps:
      - run: echo "matrix entry ${{ matrix.n }}"
  noisy:
    runs-on: [self-hosted, pod]
    steps:
      - run: for i in $(seq 1 3000); do echo "noisy line $i"; done
  quiet:
    runs-on: [self-hosted, pod]
    steps:
      - run: sleep 40; echo "woke up after 40 silent seconds"
  failing:
    runs-on: [self-hosted, pod]
    steps:
      - run: echo "about to fail"; exit 3
      - run: echo "never printed"
  always:
    needs: [failing]
    if: always()
    runs-on: [self-hosted, pod]
    steps:
      - run: echo "runs after a failure"
`

type jobResult struct {
	conclusion string
	log        string
}

// runWorkflow pushes workflow to a new repo and returns every job's conclusion and
// normalised log by job name.
func runWorkflow(t testing.TB, f *devforge.Forge, repo devforge.Repo, content string, limit time.Duration) map[string]jobResult {
	t.Helper()
	sha, err := f.PushWorkflow(t.Context(), repo, ".gitea/workflows/e2e.yml", content)
	require.NoError(t, err)
	run := waitRun(t, f, repo, sha, limit)
	out := map[string]jobResult{}
	for _, j := range run.Jobs {
		if j.Conclusion == "skipped" {
			out[j.Name] = jobResult{conclusion: j.Conclusion}
			continue
		}
		log, err := f.JobLog(t.Context(), repo, j.ID)
		require.NoError(t, err, "log of job %q", j.Name)
		assert.False(t, strings.Contains(log, secretValue), "job %q: the secret appears in clear text in its log", j.Name)
		out[j.Name] = jobResult{conclusion: j.Conclusion, log: devforge.NormalizeLog(log)}
	}
	return out
}

func TestWorkflowMatchesStaticRunner(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	ctx := t.Context()

	// The reference: a static Gitea runner in host mode on its own repository.
	static, err := f.CreateRepo(ctx, "static")
	require.NoError(t, err)
	dyn, err := f.CreateRepo(ctx, "dynamic")
	require.NoError(t, err)
	for _, r := range []devforge.Repo{static, dyn} {
		require.NoError(t, f.SetSecret(ctx, r, "E2E_SECRET", secretValue))
	}
	regStatic, err := f.RunnerRegistrationToken(ctx, static.String())
	require.NoError(t, err)
	sr, err := devforge.StartStaticRunner(ctx, tools, f.URL(), regStatic, executor.Labels(assignment.BackendPod), filepath.Join(t.TempDir(), "static"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sr.Close() })

	c := newController(t, tools, f, dyn.String(), leaseEnv, pickupEnv)
	c.start()

	type outcome struct {
		res map[string]jobResult
	}
	results := make(chan outcome, 2)
	start := time.Now()
	go func() { results <- outcome{runWorkflow(t, f, static, workflow, 10*time.Minute)} }()
	want := (<-results).res
	t.Logf("static runner: %d jobs in %s", len(want), time.Since(start).Round(time.Second))
	start = time.Now()
	got := runWorkflow(t, f, dyn, workflow, 10*time.Minute)
	t.Logf("dynrunner: %d jobs in %s", len(got), time.Since(start).Round(time.Second))

	require.Len(t, got, 8, "dynrunner ran jobs %v, the static runner %v; want the same 8", keys(got), keys(want))
	require.Len(t, want, 8, "dynrunner ran jobs %v, the static runner %v; want the same 8", keys(got), keys(want))
	for name, w := range want {
		g, ok := got[name]
		if !assert.True(t, ok, "job %q missing from the dynrunner run", name) {
			continue
		}
		assert.Equal(t, w.conclusion, g.conclusion, "job %q: dynrunner %s, static runner %s", name, g.conclusion, w.conclusion)
		assert.Equal(t, w.log, g.log, "job %q: logs differ after normalisation\n--- dynrunner\n%s\n--- static runner\n%s", name, tail(g.log, 30), tail(w.log, 30))
	}
	checkCoreWorkflow(t, got)

	// A job without an isolation label is failed with a message naming the accepted labels.
	res := runWorkflow(t, f, dyn, "name: bad\non: [push]\njobs:\n  plain:\n    runs-on: [self-hosted]\n    steps:\n      - run: echo should not run\n", 3*time.Minute)
	plain := res["plain"]
	assert.Equal(t, "failure", plain.conclusion, "runs-on [self-hosted] job:\n%s", plain.log)
	assert.Contains(t, plain.log, "accepted: [self-hosted, pod]", "runs-on [self-hosted] job log")
	assert.NotContains(t, plain.log, "should not run\n", "runs-on [self-hosted] job log")
	assertNoEnvironmentsLeft(t, c)
}

// checkCoreWorkflow checks the core workflow's own expectations of its jobs' results,
// independent of any comparison.
func checkCoreWorkflow(t testing.TB, got map[string]jobResult) {
	t.Helper()
	for name, want := range map[string]string{"produce": "success", "consume": "success", "noisy": "success", "quiet": "success", "failing": "failure", "always": "success"} {
		assert.Equal(t, want, got[name].conclusion, "job %q concluded", name)
	}
	for name, line := range map[string]string{
		"produce": "the secret is ***",
		"consume": "got from-produce",
		"noisy":   "noisy line 3000",
		"quiet":   "woke up after 40 silent seconds",
		"always":  "runs after a failure",
	} {
		assert.True(t, strings.Contains(got[name].log, line), "job %q: log lacks %q", name, line)
	}
	assert.GreaterOrEqual(t, strings.Count(got["noisy"].log, "noisy line "), 3000, "noisy job's lines logged of 3000")

}

func keys(m map[string]jobResult) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// assertNoEnvironmentsLeft checks the local backend removed every environment directory.
func assertNoEnvironmentsLeft(t testing.TB, c *controller) {
	t.Helper()
	var state string
	for _, kv := range c.env {
		if v, ok := strings.CutPrefix(kv, "STATE_DIR="); ok {
			state = v
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		entries, _ := os.ReadDir(filepath.Join(state, "envs"))
		var left []string
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				left = append(left, e.Name())
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "environments left behind: %v", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var lineRe = regexp.MustCompile(`(?m)^count (\d+)$`)

// TestControllerSIGKILLMidJob kills the controller while a job runs and starts it again: the
// job finishes with its complete log, reported once.
func TestControllerSIGKILLMidJob(t *testing.T) {
	tools := needTools(t)
	sigkillMidJob(t, tools, startForge(t, tools), nil)
}

// sigkillMidJob runs a job, SIGKILLs the controller while it runs and starts it again; the job
// must finish complete and be reported once. running, when not nil, is called once the job
// runs, before the kill.
func sigkillMidJob(t *testing.T, tools devforge.Tools, f *devforge.Forge, running func(), extra ...string) {
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "crash")
	require.NoError(t, err)
	c := newController(t, tools, f, repo.String(), append([]string{leaseEnv, pickupEnv}, extra...)...)
	c.start()
	const wf = `name: crash
on: [push]
jobs:
  survive:
    runs-on: [self-hosted, pod]
    steps:
      - run: for i in $(seq 1 200); do echo "count $i"; sleep 0.05; done
      - run: echo "second step done"
`
	sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/crash.yml", wf)
	require.NoError(t, err)
	// Wait until the job is running in its environment and logging, then crash the controller.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if log := runningLog(t, f, repo, sha); strings.Contains(log, "count 20\n") && !strings.Contains(log, "count 200") {
			break
		}
		if time.Now().After(deadline) {
			require.Fail(t, "the job did not log its 20th line within 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if running != nil {
		running()
	}
	c.kill()
	t.Log("controller SIGKILLed while the job runs")
	// Downtime on purpose (not a wait for a condition): the job keeps running and its reports
	// fail meanwhile.
	time.Sleep(3 * time.Second)
	c.start()
	run := waitRun(t, f, repo, sha, 5*time.Minute)
	require.Len(t, run.Jobs, 1, "run after the crash: %+v", run.Jobs)
	require.EqualValues(t, "success", run.Jobs[0].Conclusion, "run after the crash: %+v", run.Jobs)
	log, err := f.JobLog(ctx, repo, run.Jobs[0].ID)
	require.NoError(t, err)
	counts := lineRe.FindAllStringSubmatch(devforge.NormalizeLog(log), -1)
	require.Len(t, counts, 200, "log holds %d count lines, want exactly 200 (complete, none twice)", len(counts))
	for i, m := range counts {
		require.Equal(t, fmt.Sprint(i+1), m[1], "count line %d: log out of order or duplicated", i+1)
	}
	require.Contains(t, log, "second step done", "the second step's output is missing")
	// Reported once: the audit stream holds exactly one completed transition, read with the
	// operator's command.
	cmd := exec.Command(controllerBin(t), "events", "--json", "--follow=false")
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "dynrunner events: %v\n%s", err, out)
	require.Equal(t, 1, strings.Count(string(out), `"transition":"completed"`), "completed transitions in the audit stream, want 1:\n%s", out)
	require.NotContains(t, string(out), "gitea_runtime_token", "the audit stream shows task material")
	if len(extra) == 0 {
		assertNoEnvironmentsLeft(t, c)
	}
}

// waitLogged waits until the running job of the run for sha has logged line, for at most limit.
func waitLogged(t testing.TB, f *devforge.Forge, repo devforge.Repo, sha, line string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !strings.Contains(runningLog(t, f, repo, sha), line) {
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "the job did not log %q within %s", line, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runningLog returns the log so far of the first job of the run for sha, or "".
func runningLog(t testing.TB, f *devforge.Forge, repo devforge.Repo, sha string) string {
	runs, err := f.Runs(t.Context(), repo, sha)
	if err != nil || len(runs) == 0 {
		return ""
	}
	jobs, err := f.Jobs(t.Context(), repo, runs[0].ID)
	if err != nil || len(jobs) == 0 {
		return ""
	}
	log, err := f.JobLog(t.Context(), repo, jobs[0].ID)
	if err != nil {
		return ""
	}
	return log
}

// TestSilentStepOutlivesTheLease runs a job whose one step prints nothing for longer than the
// lease: the environment renews the lease by its timer, not by log traffic, so the job
// succeeds, and the audit stream shows the renewals that kept it alive.
func TestSilentStepOutlivesTheLease(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "silent")
	require.NoError(t, err)
	c := newController(t, tools, f, repo.String(), leaseEnv, pickupEnv)
	c.start()
	began := time.Now()
	res := runWorkflow(t, f, repo, `name: silent
on: [push]
jobs:
  silent:
    runs-on: [self-hosted, pod]
    steps:
      - run: sleep 100
      - run: echo "after the silence"
`, 6*time.Minute)
	job, ok := res["silent"]
	require.True(t, ok, "no job %q in the run: %v", "silent", keys(res))
	require.Equal(t, "success", job.conclusion, "job concluded after %s, want success past a silence longer than LEASE_SECS=90:\n%s",
		time.Since(began).Round(time.Second), tail(job.log, 30))
	require.True(t, strings.Contains(job.log, "after the silence"), "job concluded %q after %s, want success past a silence longer than LEASE_SECS=90:\n%s",
		job.conclusion, time.Since(began).Round(time.Second), tail(job.log, 30))
	cmd := exec.Command(controllerBin(t), "events", "--json", "--follow=false")
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "dynrunner events: %v\n%s", err, out)
	// Every LEASE_SECS/3 = 30 s: at least three renewals during the 100 s of silence.
	require.GreaterOrEqual(t, strings.Count(string(out), `"transition":"renewed"`), 3, "renewed transitions in the audit stream, want at least 3 during 100 s of silence:\n%s", tail(string(out), 20))
	t.Logf("the job ran %s; %d renewals", time.Since(began).Round(time.Second), strings.Count(string(out), `"transition":"renewed"`))
}
