package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/podworker/kube"
)

// TestGitHubJobsRunInKubeSlots: a job queued in GitHub for [self-hosted, pod] runs through
// the kubernetes backend: its slot's environment is a Pod of the executor image built with
// the stand-in runner (scripts/executor-image.sh with GITHUB_RUNNER_DIR), run by the test
// kubelet, whose containers reach the fake GitHub served over TLS on a host address. The
// Pod's Secret is mounted only into its init container, which copies the JIT configuration
// into the memory-backed secrets directory of the executor's container; the executor removes
// it from there and from the runner's environment before the job, which finds neither the
// file, nor the Secret, nor a Workload API; the registrar makes no SPIRE entry for the slot.
// JobStarted and JobCompleted are recorded once on the slot; afterwards neither the Pod, its
// Secret, its containers nor the runner remains.
func TestGitHubJobsRunInKubeSlots(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	ip := hostAddress(t)
	ln, err := net.Listen("tcp4", net.JoinHostPort(ip, "0"))
	require.NoError(t, err, "listen on a host address")
	srv := githubtest.New(t, githubtest.Options{Tokens: []string{"ghp_e2e"}, LongPollTimeout: time.Second, AssignOnAcquire: true,
		SessionTimeout: 5 * time.Second, Listener: ln, TLS: true})
	ca := filepath.Join(t.TempDir(), "github-ca.pem")
	require.NoError(t, secretfile.WriteNew(ca, srv.CertificatePEM()))

	e := startKube(t, "GITHUB_RUNNER_DIR="+standInRunnerDir(t, srv.CertificatePEM()))
	runnerBin := imageLabel(t, e.image, "dynrunner.github-runner.bin")
	runnerSHA := imageLabel(t, e.image, "dynrunner.github-runner.sha256")
	require.NotEmpty(t, runnerBin, "the image has no GitHub runner label")
	require.Regexp(t, `^[0-9a-f]{64}$`, runnerSHA)

	f := startForge(t, tools)
	env := append(gitHubSchedulerEnv(t, srv), "GITHUB_CA_FILE="+ca, "GITHUB_RUNNER_BIN="+runnerBin, "GITHUB_RUNNER_SHA256="+runnerSHA)
	c := newController(t, tools, f, "", append(append([]string{leaseEnv, pickupEnv, gitHubLeasesEnv}, e.controllerEnv...), env...)...)
	c.start()
	b := &gitHubBed{srv: srv, c: c}
	b.podScaleSet(t)

	// The job waits for the test to have looked at its Pod (bounded: 2 minutes).
	const gate = "/tmp/dynrunner-e2e-go"
	job, err := srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Repository: "app", DisplayName: "build",
		Run: `echo "hello from $GITHUB_REPOSITORY on $RUNNER_NAME"; echo "uid=$(id -u) home=$HOME"
test -z "${ACTIONS_RUNNER_INPUT_JITCONFIG:-}" && echo "no JIT configuration in the job"
if ls -A ` + kube.SecretsDir + ` | grep -q .; then echo "left in the secrets directory: $(ls -A ` + kube.SecretsDir + `)"; else echo "no JIT configuration file"; fi
test -e ` + kube.SecretsSourceDir + ` || echo "no secret volume"
test -e ` + kube.SpireSocketDir + ` || echo "no workload api"
test -z "${SPIFFE_ENDPOINT_SOCKET:-}" && echo "no endpoint socket"
for i in $(seq 1 1200); do test -e ` + gate + ` && break; sleep 0.1; done; echo "gate passed"`})
	require.NoError(t, err)

	// The slot's Pod, while its job runs.
	pod := e.runningPod(t)
	uid := string(pod.UID)
	task, _ := podAssignment(t, pod)
	assert.True(t, task.Slot(), "the Pod's task %d is no GitHub slot", task)
	require.Eventually(t, func() bool {
		j, _ := srv.Job(job)
		return j.State == githubtest.JobRunning
	}, 3*time.Minute, 200*time.Millisecond, "the slot's runner did not take the job")
	secretVolumes := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		assert.Nil(t, v.CSI, "the slot's Pod has a CSI volume %s", v.Name)
		if v.Secret != nil {
			secretVolumes[v.Name] = true
		}
	}
	require.Len(t, secretVolumes, 1, "volumes %+v", pod.Spec.Volumes)
	require.Len(t, pod.Spec.InitContainers, 1)
	initMounts := false
	for _, m := range pod.Spec.InitContainers[0].VolumeMounts {
		initMounts = initMounts || secretVolumes[m.Name]
	}
	assert.True(t, initMounts, "the init container does not mount the Secret")
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		assert.False(t, secretVolumes[m.Name], "the executor's container mounts the Secret at %s", m.MountPath)
	}
	ctrs := podContainers(t, uid)
	require.Len(t, ctrs, 1, "the Pod's containers: its init container removed, its executor's running")
	out, err := exec.CommandContext(t.Context(), "docker", "exec", ctrs[0], "ls", "-A", kube.SecretsDir).CombinedOutput()
	require.NoError(t, err, "docker exec ls: %s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "the JIT configuration is still in the secrets directory while the job runs")
	assert.Empty(t, e.podEntries(t, uid), "the registrar made a SPIRE entry for the slot's Pod")
	out, err = exec.CommandContext(t.Context(), "docker", "exec", ctrs[0], "touch", gate).CombinedOutput()
	require.NoError(t, err, "docker exec touch: %s", out)

	j := b.waitJob(t, job, 3*time.Minute)
	assert.Equal(t, "succeeded", j.Result)
	log, err := srv.JobLog(job)
	require.NoError(t, err)
	for _, want := range []string{"hello from octo/app on dynrunner-pod-", "uid=0 home=" + kube.HomeDir, "no JIT configuration in the job",
		"no JIT configuration file", "no secret volume", "no workload api", "no endpoint socket", "gate passed"} {
		assert.Contains(t, log, want)
	}
	if t.Failed() {
		t.Logf("job log:\n%s", tail(log, 40))
	}

	b.assertSlotLifecycle(t, task)
	e.assertGone(t, uid)
	require.Eventually(t, func() bool {
		secrets, err := e.cluster.Client.CoreV1().Secrets(e.ns).List(t.Context(), metav1.ListOptions{LabelSelector: kube.Selector})
		return err == nil && len(secrets.Items) == 0
	}, time.Minute, 200*time.Millisecond, "the slot's Secret is left")
	assertRunnersRemoved(t, srv)

	// The registrar made the facade's entry alone.
	resp, err := http.Get(e.registrarURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	assert.Contains(t, string(metrics), fmt.Sprintf("dynrunner_identity_entries_created_total %d\n", 1), "registrar metrics")
}
