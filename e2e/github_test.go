package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// gitHubBed is a controller serving a fake GitHub beside the real Gitea, with the stand-in
// runner as the pinned GitHub runner of its local environments.
type gitHubBed struct {
	srv *githubtest.Server
	c   *controller
}

func newGitHubBed(t *testing.T) *gitHubBed {
	t.Helper()
	tools := needTools(t)
	f := startForge(t, tools)
	srv := newFakeGitHub(t)
	env := append(gitHubSchedulerEnv(t, srv), gitHubWorkerEnv(t)...)
	c := newController(t, tools, f, "", append([]string{leaseEnv, pickupEnv, gitHubLeasesEnv}, env...)...)
	c.start()
	return &gitHubBed{srv: srv, c: c}
}

// gitHubLeasesEnv makes the session's lease pass within 3 s of its holder's death; every
// component against one JetStream must have the same SCHEDULER_LEASE_SECS.
const gitHubLeasesEnv = "SCHEDULER_LEASE_SECS=3"

// newFakeGitHub starts the fake GitHub the beds use: it accepts the token ghp_e2e, and times out
// the session of a holder that died after 5 s.
func newFakeGitHub(t *testing.T) *githubtest.Server {
	t.Helper()
	return githubtest.New(t, githubtest.Options{Tokens: []string{"ghp_e2e"}, LongPollTimeout: time.Second, AssignOnAcquire: true,
		SessionTimeout: 5 * time.Second})
}

// gitHubSchedulerEnv is what a scheduler needs to serve srv: its URL and a token file. An idle
// slot is retired a minute before GITHUB_IDLE_SECS: a slot's runner gets a minute to take its
// job, as a slow machine may need.
func gitHubSchedulerEnv(t *testing.T, srv *githubtest.Server) []string {
	t.Helper()
	token := filepath.Join(t.TempDir(), "github-token")
	require.NoError(t, secretfile.WriteNew(token, []byte("ghp_e2e")))
	return []string{"GITHUB_CONFIG_URL=" + srv.OrgURL("acme"), "GITHUB_TOKEN_FILE=" + token, "GITHUB_IDLE_SECS=120"}
}

// gitHubWorkerEnv is what a worker needs to serve slots: the stand-in runner, pinned.
func gitHubWorkerEnv(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755)) // environments run under uids of their own
	bin, err := githubtest.BuildStandInRunner(dir)
	require.NoError(t, err)
	b, err := os.ReadFile(bin)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return []string{"GITHUB_RUNNER_BIN=" + bin, "GITHUB_RUNNER_SHA256=" + hex.EncodeToString(sum[:])}
}

// podScaleSet waits for the controller to make the pod scale set and open its session.
func (b *gitHubBed) podScaleSet(t *testing.T) githubtest.ScaleSet {
	t.Helper()
	var set githubtest.ScaleSet
	require.Eventually(t, func() bool {
		for _, s := range b.srv.ScaleSets() {
			if s.Name == "dynrunner-pod" {
				set = s
			}
		}
		return set.ID != 0 && len(b.srv.Sessions()) == 1
	}, 60*time.Second, 100*time.Millisecond, "the controller did not make the pod scale set and open its session")
	for _, s := range b.srv.ScaleSets() {
		assert.NotEqual(t, "dynrunner-vm", s.Name, "a vm scale set was made without the vm tier")
	}
	return set
}

// waitJob waits until job completed and returns its result.
func (b *gitHubBed) waitJob(t *testing.T, job int64, limit time.Duration) githubtest.Job {
	t.Helper()
	var j githubtest.Job
	require.Eventually(t, func() bool {
		var err error
		j, err = b.srv.Job(job)
		return err == nil && j.State == githubtest.JobCompleted
	}, limit, 200*time.Millisecond, "job %d did not complete (last %+v)", job, j)
	return j
}

// slotRecords are the controller's records of GitHub slots, from `dynrunner events`.
func (b *gitHubBed) slotRecords(t *testing.T) []assignment.State {
	t.Helper()
	cmd := exec.Command(controllerBin(t), "events", "--json", "--follow=false", "--environments=false")
	cmd.Env = b.c.env
	out, err := cmd.Output()
	require.NoError(t, err, "dynrunner events")
	var recs []assignment.State
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var st assignment.State
		if line == "" || json.Unmarshal([]byte(line), &st) != nil || !st.GitHub() {
			continue
		}
		recs = append(recs, st)
	}
	return recs
}

// cli runs a dynrunner subcommand against the bed's NATS and returns what it printed; status
// exits non-zero when the fleet is incomplete, which is not this helper's concern.
func (b *gitHubBed) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(controllerBin(t), args...)
	cmd.Env = b.c.env
	out, _ := cmd.Output()
	return string(out)
}

// transitions counts each slot's transitions.
func transitions(recs []assignment.State) map[assignment.TaskID]map[assignment.Transition]int {
	out := map[assignment.TaskID]map[assignment.Transition]int{}
	for _, r := range recs {
		if out[r.Task] == nil {
			out[r.Task] = map[assignment.Transition]int{}
		}
		out[r.Task][r.Transition]++
	}
	return out
}

// slotLifecycle is what a slot whose runner took a job and finished goes through, each once.
var slotLifecycle = []assignment.Transition{assignment.Claimed, assignment.Configured, assignment.Dispatched,
	assignment.Started, assignment.Running, assignment.Completed}

// assertSlotLifecycle waits for slot task to complete, then asserts each transition of its
// lifecycle was recorded once.
func (b *gitHubBed) assertSlotLifecycle(t *testing.T, task assignment.TaskID) {
	t.Helper()
	var recs map[assignment.TaskID]map[assignment.Transition]int
	require.Eventually(t, func() bool {
		recs = transitions(b.slotRecords(t))
		return recs[task][assignment.Completed] == 1
	}, time.Minute, time.Second, "the slot was not completed: %v", recs)
	for _, want := range slotLifecycle {
		assert.Equal(t, 1, recs[task][want], "slot %d: %s records", task, want)
	}
}

// assertRunnersRemoved waits until GitHub holds no runner, at least one having been removed by
// id (not only expired).
func assertRunnersRemoved(t *testing.T, srv *githubtest.Server) {
	t.Helper()
	require.Eventually(t, func() bool { return len(srv.Runners()) == 0 && srv.Requests(githubtest.OpRemoveRunner) > 0 },
		time.Minute, 200*time.Millisecond, "runners left at GitHub: %+v, removals %d", srv.Runners(), srv.Requests(githubtest.OpRemoveRunner))
}

// TestGitHubJobsRunInSlots: jobs queued in GitHub for [self-hosted, pod] each get a slot,
// persisted before GitHub is called, configured with a JIT runner, started as a local
// environment that runs the pinned runner (the stand-in), which takes the job GitHub gave it;
// JobStarted and JobCompleted are recorded on the slot, and the environment and the runner are
// gone afterwards. A failing job fails on GitHub and still completes its slot.
func TestGitHubJobsRunInSlots(t *testing.T) {
	b := newGitHubBed(t)
	b.podScaleSet(t)
	ok, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Repository: "app", DisplayName: "build",
		Run: `echo "hello from $GITHUB_REPOSITORY on $RUNNER_NAME"; id -u; test -z "${ACTIONS_RUNNER_INPUT_JITCONFIG:-}" && echo "no JIT configuration in the job"`})
	require.NoError(t, err)
	bad, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Repository: "app", DisplayName: "test", Run: "echo failing; exit 3"})
	require.NoError(t, err)

	j := b.waitJob(t, ok, 3*time.Minute)
	assert.Equal(t, "succeeded", j.Result)
	log, err := b.srv.JobLog(ok)
	require.NoError(t, err)
	assert.Contains(t, log, "hello from octo/app on dynrunner-pod-")
	assert.Contains(t, log, "no JIT configuration in the job")
	assert.Equal(t, "failed", b.waitJob(t, bad, 3*time.Minute).Result)

	require.Eventually(t, func() bool {
		done := 0
		for _, tr := range transitions(b.slotRecords(t)) {
			done += tr[assignment.Completed]
		}
		return done == 2
	}, time.Minute, time.Second, "the slots were not completed")
	for task, tr := range transitions(b.slotRecords(t)) {
		if tr[assignment.Completed] == 0 {
			continue
		}
		for _, want := range slotLifecycle {
			assert.Equal(t, 1, tr[want], "slot %d: %s records", task, want)
		}
	}
	assertNoEnvironmentsLeft(t, b.c)
	require.Eventually(t, func() bool { return len(b.srv.Runners()) == 0 }, time.Minute, 200*time.Millisecond,
		"runners left at GitHub: %+v", b.srv.Runners())
}

// TestGitHubSlotsSurviveAControllerKill: the controller is killed (SIGKILL) after GitHub made a
// slot's runner but before the controller heard back, and again while a job runs. Each time the
// restarted controller finishes what was left: the runner whose configuration was lost is
// removed and made again for the same slot, the running environment is adopted; every job
// completes once, no runner is left, and no slot started two environments.
func TestGitHubSlotsSurviveAControllerKill(t *testing.T) {
	b := newGitHubBed(t)
	set := b.podScaleSet(t)

	// Kill 1: GitHub made the runner, the answer never arrived.
	stalled := make(chan struct{})
	b.srv.InjectFault(githubtest.OpGenerateJITConfig, githubtest.Fault{Withhold: true, Stalled: stalled})
	first, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Run: "echo first"})
	require.NoError(t, err)
	select {
	case <-stalled:
	case <-time.After(2 * time.Minute):
		require.FailNow(t, "the controller did not ask GitHub for a JIT runner")
	}
	require.Len(t, b.srv.Runners(), 1, "the withheld request made no runner")
	orphan := b.srv.Runners()[0]
	b.c.kill()
	b.c.start()
	assert.Equal(t, "succeeded", b.waitJob(t, first, 3*time.Minute).Result)
	j, err := b.srv.Job(first)
	require.NoError(t, err)
	assert.Equal(t, orphan.Name, j.RunnerName, "the job ran on another slot's runner than the one claimed before the kill")
	assert.NotEqual(t, orphan.ID, j.RunnerID, "the runner whose configuration was lost was used")

	// Kill 2: while a job runs in its environment.
	marker := filepath.Join(t.TempDir(), "go")
	require.NoError(t, os.Chmod(filepath.Dir(marker), 0o777))
	second, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"},
		Run: fmt.Sprintf(`echo started; for i in $(seq 1 600); do test -e %s && break; sleep 0.1; done; echo second done`, marker)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { j, _ := b.srv.Job(second); return j.State == githubtest.JobRunning },
		2*time.Minute, 200*time.Millisecond, "the second job did not start")
	// The operator's view of it: `dynrunner status` counts the slot running a job, `dynrunner
	// events` names its runner and the job GitHub gave it.
	require.Eventually(t, func() bool {
		return strings.Contains(b.cli(t, "status"), "of which GitHub slots: 1 (1 running a job")
	}, time.Minute, time.Second, "status does not show the slot running a job:\n%s", b.cli(t, "status"))
	assert.Regexp(t, `running +backend=pod actor=\S+ forge=github slot=\d+ scale_set=\d+ runner=dynrunner-pod-\S+ runner_id=\d+ github_job=\S+ run=\d+`,
		b.cli(t, "events", "--follow=false", "--environments=false"))
	b.c.kill()
	b.c.start()
	require.NoError(t, os.WriteFile(marker, nil, 0o644))
	assert.Equal(t, "succeeded", b.waitJob(t, second, 3*time.Minute).Result)
	log, err := b.srv.JobLog(second)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(log, "second done"), "the second job ran more or less than once:\n%s", log)

	require.Eventually(t, func() bool {
		done := 0
		for _, tr := range transitions(b.slotRecords(t)) {
			done += tr[assignment.Completed]
		}
		return done == 2
	}, time.Minute, time.Second, "the slots were not completed")
	for task, tr := range transitions(b.slotRecords(t)) {
		assert.LessOrEqual(t, tr[assignment.Started], 1, "slot %d started %d environments", task, tr[assignment.Started])
		assert.LessOrEqual(t, tr[assignment.Configured], 1, "slot %d was configured %d times", task, tr[assignment.Configured])
	}
	assertNoEnvironmentsLeft(t, b.c)
	require.Eventually(t, func() bool { return len(b.srv.Runners()) == 0 }, time.Minute, 200*time.Millisecond,
		"runners left at GitHub: %+v", b.srv.Runners())
	_ = set
}

// TestGitHubLostEnvironmentIsRerun: a job's environment is killed while the job runs. The slot
// fails as lost; nothing is asked of GitHub while the lost job is still in progress there; once
// GitHub fails the job (the test plays GitHub giving up on the runner) and the run completes,
// the controller asks rerun-failed-jobs once, and the rerun's job runs in a new slot and
// succeeds.
func TestGitHubLostEnvironmentIsRerun(t *testing.T) {
	b := newGitHubBed(t)
	b.podScaleSet(t)
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777)) // environments run under uids of their own
	mark := filepath.Join(dir, "first-attempt")
	const runID = 4242
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Repository: "app", WorkflowRunID: runID,
		Run: fmt.Sprintf(`if test -e %[1]s; then echo "rerun ran"; exit 0; fi; touch %[1]s; echo "first attempt"; sleep 600`, mark)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := os.Stat(mark); return err == nil }, 2*time.Minute, 200*time.Millisecond,
		"the first attempt did not start")

	// Evict the environment: kill its process group, as a node going away would.
	var slot assignment.State
	require.Eventually(t, func() bool {
		for _, st := range b.slotRecords(t) {
			if st.Transition == assignment.Started || (st.Phase == assignment.Running && len(st.Handle) > 0) {
				slot = st
			}
		}
		return slot.Task != 0
	}, time.Minute, time.Second, "no started slot")
	var h struct {
		Data map[string]string `json:"data"`
	}
	require.NoError(t, json.Unmarshal(slot.Handle, &h))
	pgid, err := strconv.Atoi(h.Data["pgid"])
	require.NoError(t, err, "handle %s", slot.Handle)
	require.NoError(t, syscall.Kill(-pgid, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		for _, st := range b.slotRecords(t) {
			if st.Task == slot.Task && st.Transition == assignment.Failed {
				return st.Lost
			}
		}
		return false
	}, time.Minute, time.Second, "the killed environment's slot did not fail as lost")
	j, err := b.srv.Job(job)
	require.NoError(t, err)
	require.Equal(t, githubtest.JobRunning, j.State, "the lost job ended at GitHub by itself")
	reads := b.srv.Requests(githubtest.OpGetWorkflowRun)
	require.Eventually(t, func() bool { return b.srv.Requests(githubtest.OpGetWorkflowRun) > reads }, 2*time.Minute, time.Second,
		"the controller did not read the run")
	assert.Zero(t, b.srv.Requests(githubtest.OpRerunFailedJobs), "a rerun was asked while the run was in progress")

	// GitHub gives up on the lost runner: the job fails and the run completes.
	require.NoError(t, b.srv.CompleteJob(job, "failed"))
	var again githubtest.Job
	require.Eventually(t, func() bool {
		jobs := b.srv.RunJobs(runID)
		if len(jobs) == 2 {
			again = jobs[1]
		}
		return again.ID != 0
	}, 3*time.Minute, time.Second, "the run was not rerun")
	assert.Equal(t, 2, again.Attempt)
	assert.Equal(t, "succeeded", b.waitJob(t, again.ID, 3*time.Minute).Result)
	log, err := b.srv.JobLog(again.ID)
	require.NoError(t, err)
	assert.Contains(t, log, "rerun ran")
	run, err := b.srv.WorkflowRun(runID)
	require.NoError(t, err)
	assert.Equal(t, 1, run.Reruns)
	assert.Equal(t, githubtest.ConclusionSuccess, run.Conclusion)
	assert.Equal(t, 1, b.srv.Requests(githubtest.OpRerunFailedJobs), "rerun-failed-jobs was called more than once")
}
