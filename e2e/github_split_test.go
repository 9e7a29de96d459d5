package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// TestGitHubSplitDeployment runs GitHub as a split deployment runs it over several hosts: two
// schedulers holding the GitHub credentials, a facade, and a pod worker that has only the
// runner's pin, each its own process with its own NATS user of deploy/nats/permissions.conf.
// The two schedulers never both open the pod scale set's session: only the lease's holder asks
// GitHub for one. Jobs run once each on the worker. When the holder is killed (SIGKILL), the
// other scheduler opens the session once GitHub timed out the dead one's, and serves the next
// job; no runner is left at GitHub.
func TestGitHubSplitDeployment(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	secrets := splitSecrets(t, f, "dynrunner-github-split")
	natsURL := startPermissionedNATS(t, secrets).ClientURL()
	srv := newFakeGitHub(t)

	schedulers := []*controller{
		newComponent(t, "scheduler-a", liveness.KindScheduler, f.URL(), natsURL, secrets, tools),
		newComponent(t, "scheduler-b", liveness.KindScheduler, f.URL(), natsURL, secrets, tools),
	}
	for _, s := range schedulers {
		s.env = append(s.env, gitHubSchedulerEnv(t, srv)...)
	}
	facade := newComponent(t, "facade", liveness.KindFacade, f.URL(), natsURL, secrets, tools)
	worker := newComponent(t, "pod-worker", liveness.KindPodWorker, f.URL(), natsURL, secrets, tools)
	worker.env = append(worker.env, gitHubWorkerEnv(t)...)
	for _, c := range append([]*controller{facade, worker}, schedulers...) {
		c.env = append(c.env, gitHubLeasesEnv)
	}
	schedulers[0].start() // it creates the topology (the other users may only look it up)
	for _, c := range []*controller{schedulers[1], facade, worker} {
		c.start()
	}

	// holder is the scheduler whose actor (scheduler@host/pid/...) owns the open session.
	holder := func() (*controller, bool) {
		sessions := srv.Sessions()
		if len(sessions) != 1 {
			return nil, false
		}
		for _, s := range schedulers {
			if strings.Contains(sessions[0].Owner, fmt.Sprintf("/%d/", s.cmd.Process.Pid)) {
				return s, true
			}
		}
		return nil, false
	}
	require.Eventually(t, func() bool { _, ok := holder(); return ok }, 2*time.Minute, 200*time.Millisecond,
		"no scheduler opened the pod scale set's session (sessions %+v)", srv.Sessions())
	first, _ := holder()

	run := func(name string) {
		t.Helper()
		id, err := srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Repository: "split", DisplayName: name,
			Run: "echo ran " + name})
		require.NoError(t, err)
		require.Eventually(t, func() bool { j, _ := srv.Job(id); return j.State == githubtest.JobCompleted },
			3*time.Minute, 200*time.Millisecond, "job %s did not complete", name)
		j, err := srv.Job(id)
		require.NoError(t, err)
		assert.Equal(t, "succeeded", j.Result, "job %s", name)
		log, err := srv.JobLog(id)
		require.NoError(t, err)
		assert.Equal(t, 1, strings.Count(log, "ran "+name), "job %s ran more or less than once:\n%s", name, log)
	}
	run("one")
	run("two")
	assert.Equal(t, 1, srv.Requests(githubtest.OpCreateSession),
		"a scheduler without the lease asked GitHub for a session")
	h, ok := holder()
	require.True(t, ok)
	assert.Same(t, first, h, "the session moved while its holder lived")

	first.kill()
	var next *controller
	require.Eventually(t, func() bool { next, ok = holder(); return ok && next != first }, 2*time.Minute, 200*time.Millisecond,
		"the other scheduler did not open the session after its holder was killed (sessions %+v)", srv.Sessions())
	run("three")
	require.Eventually(t, func() bool { return len(srv.Runners()) == 0 }, time.Minute, 200*time.Millisecond,
		"runners left at GitHub: %+v", srv.Runners())
}
