package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// TestDrainAWorkerRunningJobs runs dynrunner split (a scheduler, a facade, pod workers, each its
// own process and NATS user) against the real Gitea. A pod worker running two jobs is drained
// with `dynrunner drain`: a third job pushed meanwhile is not started on it, it reports
// safe_to_remove only after both its jobs ended green, and a second worker runs the third job.
// That worker, drained while a job runs and then SIGKILLed, loses no job: restarted, it adopts
// the job, which ends green. Restarted with DRAIN_SECS, a SIGTERM makes it finish its job
// before it exits.
func TestDrainAWorkerRunningJobs(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	ctx := t.Context()

	secrets := splitSecrets(t, f, "dynrunner-drain")
	natsURL := startPermissionedNATS(t, secrets).ClientURL()
	component := func(name, kind string) *controller {
		c := newComponent(t, name, kind, f.URL(), natsURL, secrets, tools)
		// The third job waits for a worker while the only one drains: room for that on a
		// loaded machine (the last value of a variable counts).
		c.env = append(c.env, "PICKUP_SECS=240", "LEASE_SECS=300")
		return c
	}
	sched := component("scheduler", liveness.KindScheduler)
	sched.start() // creates the topology
	facade := component("facade", liveness.KindFacade)
	facade.start()
	// Workers hand their environments the facade's URL, and SVIDs of the facade's development CA.
	worker := func(name string) *controller {
		c := component(name, liveness.KindPodWorker)
		c.env = append(c.env, "RUNNER_FACADE_URL=https://"+envValue(facade, "RUNNER_FACADE_LISTEN"))
		require.NoError(t, os.MkdirAll(stateDir(c), 0o700))
		require.NoError(t, os.Symlink(filepath.Join(stateDir(facade), "ca"), filepath.Join(stateDir(c), "ca")))
		return c
	}
	a := worker("pod-worker-a")
	a.start()
	idA := workerID(t, natsURL, secrets, a)

	// One repository per workflow: a push runs every workflow of its repository.
	repos := map[string]devforge.Repo{}
	pushJobs := func(name string, jobs int, script string) string {
		repo, err := f.CreateRepo(ctx, "drain-"+name)
		require.NoError(t, err)
		repos[name] = repo
		var b strings.Builder
		fmt.Fprintf(&b, "name: %s\non: [push]\njobs:\n", name)
		for i := 1; i <= jobs; i++ {
			fmt.Fprintf(&b, "  %s%d:\n    runs-on: [self-hosted, pod]\n    steps:\n      - run: %s\n", name, i, script)
		}
		sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/"+name+".yml", b.String())
		require.NoError(t, err)
		return sha
	}
	finished := func(name, sha string) bool {
		runs, err := f.Runs(ctx, repos[name], sha)
		return err == nil && len(runs) == 1 && runs[0].Status == devforge.StatusCompleted
	}

	// Two jobs run on worker a.
	long := pushJobs("long", 2, "sleep 15; echo long done")
	require.Eventually(t, func() bool { return workerState(t, sched, idA).InFlight == 2 }, 3*time.Minute, 500*time.Millisecond,
		"worker a does not run the two jobs")

	out := drain(t, sched, "--wait", "0s", idA)
	assert.Contains(t, out, "cordoned true")
	assert.Contains(t, out, "safe_to_remove false")
	third := pushJobs("third", 1, "echo third done")

	// Until both its jobs ended, a is not safe to remove, and it never takes the third.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		s := workerState(t, sched, idA)
		require.LessOrEqual(t, s.InFlight, 2, "a cordoned worker took a new job")
		if s.SafeToRemove {
			require.True(t, finished("long", long), "safe_to_remove while its jobs run")
			break
		}
		require.False(t, time.Now().After(deadline), "worker a not safe to remove within 3 minutes: %+v", s)
		time.Sleep(500 * time.Millisecond)
	}
	require.False(t, finished("third", third), "the third job ran, though the only worker was draining")
	run := waitRun(t, f, repos["long"], long, time.Minute)
	for _, j := range run.Jobs {
		assert.Equal(t, "success", j.Conclusion, "job %s of the drained worker", j.Name)
	}

	// A second worker takes the third job.
	b := worker("pod-worker-b")
	b.start()
	run = waitRun(t, f, repos["third"], third, 3*time.Minute)
	require.Equal(t, "success", run.Jobs[0].Conclusion)

	// b is drained while it runs a job, then killed: restarted, it adopts the job.
	last := pushJobs("last", 1, "sleep 20; echo last done")
	idB := workerID(t, natsURL, secrets, b)
	require.Eventually(t, func() bool { return workerState(t, sched, idB).InFlight == 1 }, 3*time.Minute, 500*time.Millisecond,
		"worker b does not run the last job")
	drain(t, sched, idB)
	b.kill()
	b.env = append(b.env, "DRAIN_SECS=120") // for the SIGTERM below
	b.start()
	run = waitRun(t, f, repos["last"], last, 5*time.Minute)
	assert.Equal(t, "success", run.Jobs[0].Conclusion, "the job of the worker killed while cordoned")
	log, err := f.JobLog(ctx, repos["last"], run.Jobs[0].ID)
	require.NoError(t, err)
	assert.Contains(t, log, "last done")

	// With DRAIN_SECS, SIGTERM drains: the worker exits once its job ended, not before.
	final := pushJobs("final", 1, "sleep 10; echo final done")
	idB = workerID(t, natsURL, secrets, b)
	require.Eventually(t, func() bool { return workerState(t, sched, idB).InFlight == 1 }, 3*time.Minute, 500*time.Millisecond,
		"the restarted worker b does not run the final job")
	b.stop()
	require.True(t, finished("final", final), "the worker stopped before its job ended")
	run = waitRun(t, f, repos["final"], final, time.Minute)
	assert.Equal(t, "success", run.Jobs[0].Conclusion, "the job of the worker stopped with DRAIN_SECS")
	logB, err := os.ReadFile(b.logPath)
	require.NoError(t, err)
	assert.Contains(t, string(logB), "drained: no environment left")
}

// workerID is the id `dynrunner drain` takes for the pod worker process c: its heartbeat key,
// from `dynrunner status`.
func workerID(t *testing.T, natsURL, secrets string, c *controller) string {
	t.Helper()
	prefix := processInstance(t, c)
	var id string
	require.Eventually(t, func() bool {
		r, _ := status(t, natsURL, secrets)
		for _, inst := range instances(r, liveness.KindPodWorker) {
			if strings.HasPrefix(inst, prefix) {
				id = liveness.KindPodWorker + "." + inst
				return true
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "the worker does not beat")
	return id
}

// drainState is what GET /v1/workers/{id} answers.
type drainState struct {
	InFlight     int  `json:"in_flight"`
	Cordoned     bool `json:"cordoned"`
	Draining     bool `json:"draining"`
	SafeToRemove bool `json:"safe_to_remove"`
}

func workerState(t *testing.T, sched *controller, id string) drainState {
	t.Helper()
	resp, err := http.Get(sched.httpURL + "/v1/workers/" + url.PathEscape(id))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var s drainState
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

// drain runs `dynrunner drain args...` against the scheduler's HTTP_LISTEN.
func drain(t *testing.T, sched *controller, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), controllerBin(t), append([]string{"drain"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "HTTP_LISTEN=" + strings.TrimPrefix(sched.httpURL, "http://")}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "dynrunner drain: %s", out)
	return string(out)
}
