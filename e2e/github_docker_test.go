package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

// ensureJobNetwork makes the docker backend's default job network as the controller would (an
// isolated bridge labelled as dynrunner's), unless it exists, so that a test can serve on its
// gateway before the controller starts; the controller adopts it, and needDocker's cleanup
// removes it.
func ensureJobNetwork(t *testing.T) {
	t.Helper()
	if exec.CommandContext(t.Context(), "docker", "network", "inspect", docker.DefaultNetwork).Run() == nil {
		return
	}
	out, err := exec.CommandContext(t.Context(), "docker", "network", "create", "--driver", "bridge",
		"--label", docker.LabelManaged+"=true", "--opt", "com.docker.network.bridge.enable_icc=false", docker.DefaultNetwork).CombinedOutput()
	require.NoError(t, err, "docker network create: %s", out)
}

// standInRunnerDir is a GITHUB_RUNNER_DIR for scripts/executor-image.sh holding the stand-in
// runner (static, for the image's libc) and a run.sh that runs it trusting ca (the fake's
// certificate), as an operator's image would hold a GitHub Enterprise Server's private CA.
func standInRunnerDir(t *testing.T, ca []byte) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	cmd := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-o", filepath.Join(dir, "standinrunner"), githubtest.StandInRunnerPackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build the stand-in runner: %s", out)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.pem"), ca, 0o644))
	runSh := "#!/bin/sh\n# The stand-in for GitHub's run.sh, trusting the fake's certificate.\n" +
		"dir=$(dirname \"$0\")\nSTANDIN_RUNNER_CA_FILE=$dir/ca.pem exec \"$dir/standinrunner\" \"$@\"\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run.sh"), []byte(runSh), 0o755))
	return dir
}

// imageLabel reads one label of a local image.
func imageLabel(t *testing.T, image, label string) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "docker", "image", "inspect", "-f", fmt.Sprintf("{{index .Config.Labels %q}}", label), image).CombinedOutput()
	require.NoError(t, err, "docker image inspect %s: %s", image, out)
	return strings.TrimSpace(string(out))
}

// slotContainer is the one running job container of the default scope, as docker inspect
// shows it.
type slotContainer struct {
	ID     string
	Image  string
	Config struct {
		Labels map[string]string
	}
	Mounts []struct {
		Destination string
		RW          bool
	}
}

// TestGitHubJobsRunInDockerSlots: a job queued in GitHub for [self-hosted, pod] runs through
// the docker backend: its slot is persisted and configured with a JIT runner, and its
// environment is a hardened container of the executor image built with the stand-in runner
// (scripts/executor-image.sh with GITHUB_RUNNER_DIR). From the container on the isolated job
// network, the runner reaches the fake GitHub served on the network's gateway over TLS (its
// certificate names the gateway's address), takes the job GitHub gave it, and reports it. The
// container's secrets directory is writable and empty once the executor read the JIT
// configuration, and it has no Workload API. JobStarted and JobCompleted are recorded on the
// slot; afterwards neither the container nor the runner (removed by id) remains.
func TestGitHubJobsRunInDockerSlots(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	ensureJobNetwork(t)
	if left := managedContainers(t); len(left) > 0 {
		t.Logf("dynrunner containers left by an earlier run (the controller reaps them): %v", left)
	}
	gateway := jobNetworkGateway(t, docker.DefaultNetwork)
	ln, err := net.Listen("tcp4", net.JoinHostPort(gateway, "0"))
	require.NoError(t, err, "listen on the job network's gateway")
	srv := githubtest.New(t, githubtest.Options{Tokens: []string{"ghp_e2e"}, LongPollTimeout: time.Second, AssignOnAcquire: true,
		SessionTimeout: 5 * time.Second, Listener: ln, TLS: true})
	ca := filepath.Join(t.TempDir(), "github-ca.pem")
	require.NoError(t, secretfile.WriteNew(ca, srv.CertificatePEM()))

	image := executorImage(t, "GITHUB_RUNNER_DIR="+standInRunnerDir(t, srv.CertificatePEM()))
	runnerBin := imageLabel(t, image, "dynrunner.github-runner.bin")
	runnerSHA := imageLabel(t, image, "dynrunner.github-runner.sha256")
	require.NotEmpty(t, runnerBin, "the image has no GitHub runner label")
	require.Regexp(t, `^[0-9a-f]{64}$`, runnerSHA)

	f := startForge(t, tools)
	env := append(gitHubSchedulerEnv(t, srv), "GITHUB_CA_FILE="+ca, "GITHUB_RUNNER_BIN="+runnerBin, "GITHUB_RUNNER_SHA256="+runnerSHA,
		"POD_BACKEND=docker", "POD_EXECUTOR_IMAGE="+image)
	c := newController(t, tools, f, "", append([]string{leaseEnv, pickupEnv, gitHubLeasesEnv}, env...)...)
	c.start()
	b := &gitHubBed{srv: srv, c: c}
	b.podScaleSet(t)

	// The job waits for the test to have looked at its container (bounded: 2 minutes).
	const gate = "/tmp/dynrunner-e2e-go"
	job, err := srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Repository: "app", DisplayName: "build",
		Run: `echo "hello from $GITHUB_REPOSITORY on $RUNNER_NAME"; echo "uid=$(id -u) home=$HOME"
test -e /.dockerenv && echo "in a container"
if touch /should-fail 2>/dev/null; then echo "the root file system is writable"; else echo "read-only root"; fi
test -z "${ACTIONS_RUNNER_INPUT_JITCONFIG:-}" && echo "no JIT configuration in the job"
if ls -A ` + docker.SecretsDir + ` | grep -q .; then echo "left in the secrets directory: $(ls -A ` + docker.SecretsDir + `)"; else echo "no JIT configuration file"; fi
test -e /run/spire/sockets || echo "no workload api"
for i in $(seq 1 1200); do test -e ` + gate + ` && break; sleep 0.1; done; echo "gate passed"`})
	require.NoError(t, err)

	// The slot's container, while its job runs.
	var ctr slotContainer
	require.Eventually(t, func() bool {
		out, err := exec.CommandContext(t.Context(), "docker", "ps", "-q", "--no-trunc", "--filter", "label=dynrunner.managed=true", "--filter", "label=dynrunner.scope=default").Output()
		ids := strings.Fields(string(out))
		if err != nil || len(ids) != 1 {
			return false
		}
		out, err = exec.CommandContext(t.Context(), "docker", "inspect", ids[0]).Output()
		var got []slotContainer
		if err != nil || json.Unmarshal(out, &got) != nil || len(got) != 1 {
			return false
		}
		ctr = got[0]
		j, _ := srv.Job(job)
		return j.State == githubtest.JobRunning
	}, 3*time.Minute, 200*time.Millisecond, "no job container running the GitHub job")
	assert.Equal(t, image, ctr.Image, "the container runs another image")
	task, err := assignment.ParseTaskID(ctr.Config.Labels[docker.LabelTask])
	require.NoError(t, err, "labels %v", ctr.Config.Labels)
	assert.True(t, task.Slot(), "the container's task %d is no GitHub slot", task)
	mounts := map[string]bool{}
	for _, m := range ctr.Mounts {
		mounts[m.Destination] = m.RW
	}
	assert.Equal(t, map[string]bool{docker.SecretsDir: true}, mounts, "mounts: the secrets directory writable, nothing else (no Workload API)")
	out, err := exec.CommandContext(t.Context(), "docker", "exec", ctr.ID, "ls", "-A", docker.SecretsDir).CombinedOutput()
	require.NoError(t, err, "docker exec ls: %s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "the JIT configuration is still in the secrets directory while the job runs")
	out, err = exec.CommandContext(t.Context(), "docker", "exec", ctr.ID, "touch", gate).CombinedOutput()
	require.NoError(t, err, "docker exec touch: %s", out)

	j := b.waitJob(t, job, 3*time.Minute)
	assert.Equal(t, "succeeded", j.Result)
	log, err := srv.JobLog(job)
	require.NoError(t, err)
	for _, want := range []string{"hello from octo/app on dynrunner-pod-", "uid=1000 home=/home/runner", "in a container", "read-only root",
		"no JIT configuration in the job", "no JIT configuration file", "no workload api", "gate passed"} {
		assert.Contains(t, log, want)
	}
	if t.Failed() {
		t.Logf("job log:\n%s", tail(log, 40))
	}

	b.assertSlotLifecycle(t, task)
	assertNoContainers(t)
	assertNoEnvironmentsLeft(t, c)
	assertRunnersRemoved(t, srv)
}
