package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/testbed/spiretest"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

// dockerSocket is the engine the docker pod backend uses by default.
const dockerSocket = "/var/run/docker.sock"

// needDocker skips the test when the Docker engine does not answer, and fails it in CI.
func needDocker(t testing.TB) {
	t.Helper()
	t.Cleanup(func() { removeJobNetwork(t) }) // after the test's controllers stopped
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", dockerSocket)
	}}}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", nil)
	resp, err := hc.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
	}
	msg := "the Docker engine at " + dockerSocket + " does not answer; start it with `systemctl start docker` and run as root"
	if os.Getenv("CI") != "" {
		require.Fail(t, msg)
	}
	t.Skip(msg)
}

// executorImage builds the executor image with scripts/executor-image.sh and returns its ID;
// env is added to the script's environment (GITHUB_RUNNER_DIR, for instance).
func executorImage(t testing.TB, env ...string) string {
	t.Helper()
	began := time.Now()
	cmd := exec.CommandContext(t.Context(), "bash", filepath.Join("..", "scripts", "executor-image.sh"))
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "scripts/executor-image.sh:\n%s", tail(stderr.String(), 40))
	id := strings.TrimSpace(stdout.String())
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, id, "scripts/executor-image.sh printed %q, want an image ID\n%s", id, tail(stderr.String(), 40))
	t.Logf("executor image %s built in %s", id[:19], time.Since(began).Round(100*time.Millisecond))
	return id
}

// jobNetworkGateway returns the gateway address of a docker job network, as an operator would
// read it.
func jobNetworkGateway(t testing.TB, name string) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "docker", "network", "inspect", "-f", "{{range .IPAM.Config}}{{.Gateway}}{{end}}", name).CombinedOutput()
	require.NoError(t, err, "docker network inspect %s: %v\n%s", name, err, out)
	gw := strings.TrimSpace(string(out))
	require.NotNil(t, net.ParseIP(gw), "network %s has gateway %q", name, gw)
	return gw
}

// removeJobNetwork removes the default job network and its firewall once a test is done with
// them, as an operator retiring the host would: the next test's controller creates them again.
func removeJobNetwork(t testing.TB) {
	out, err := exec.Command("docker", "network", "inspect", "-f", "{{.Id}}", "dynrunner").Output()
	if err != nil {
		return // none
	}
	id := strings.TrimSpace(string(out))
	if len(id) >= 12 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, docker.RemoveFirewall(ctx, "br-"+id[:12]), "remove the job network's firewall")
	}
	out, err = exec.Command("docker", "network", "rm", "dynrunner").CombinedOutput()
	assert.NoError(t, err, "docker network rm dynrunner:\n%s", out)
}

// assertNoContainers waits, for at most 30 s, until no container of the docker backend's
// default scope is left.
func assertNoContainers(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := managedContainers(t)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "dynrunner containers left behind: %v", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// managedContainers lists the containers of the docker backend's default scope, as an operator
// would.
func managedContainers(t testing.TB) []string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "docker", "ps", "-a", "--format", "{{.Names}} {{.Status}}",
		"--filter", "label=dynrunner.managed=true", "--filter", "label=dynrunner.scope=default").CombinedOutput()
	require.NoError(t, err, "docker ps: %v\n%s", err, out)
	return strings.Fields(strings.TrimSpace(string(out)))
}

const dockerWorkflow = `name: docker
on: [push]
jobs:
  hardened:
    runs-on: [self-hosted, pod]
    steps:
      - name: capabilities
        run: grep Cap /proc/self/status
      - name: read-only root
        run: |
          if touch /should-fail; then echo "the root file system is writable"; exit 1; fi
          echo "touch of / refused"
      - name: limits
        run: |
          # cgroup v2 files, else cgroup v1 (memory, then pids)
          cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max 2>/dev/null ||
            cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max
      - name: user
        run: echo "uid=$(id -u) home=$HOME"; echo "the secret is ${{ secrets.E2E_SECRET }}"
      - name: the host's services
        run: |
          for a in @PROBES@; do
            if timeout 5 bash -c "exec 3<>/dev/tcp/${a%:*}/${a##*:}" 2>/dev/null; then echo "reached $a"; else echo "refused $a"; fi
          done
`

// TestDockerBackendHardenedJob runs a job in a container of the docker pod backend, built from
// the real executor image on the default (isolated) job network, and checks from inside the
// job that the container is hardened, and that of the host it reaches the facade alone: not
// the controller's metrics nor another service (as a NATS node on the host would be), both
// served on every address of the host, neither at the job network's gateway nor at another
// address of the host.
func TestDockerBackendHardenedJob(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	image := executorImage(t)
	if left := managedContainers(t); len(left) > 0 {
		t.Logf("dynrunner containers left by an earlier run (the controller reaps them): %v", left)
	}
	f, host := startForgeOnHost(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "docker")
	require.NoError(t, err)
	require.NoError(t, f.SetSecret(ctx, repo, "E2E_SECRET", secretValue))
	// A service of the host on every address, as a NATS node of an external cluster would be
	// (the embedded server serves loopback only).
	svc, err := net.Listen("tcp4", "0.0.0.0:0")
	require.NoError(t, err)
	t.Cleanup(func() { svc.Close() })
	go func() {
		for {
			c, err := svc.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	natsPort := svc.Addr().(*net.TCPAddr).Port
	facadePort := freePort(t)
	c := newController(t, tools, f, repo.String(), leaseEnv, pickupEnv,
		"POD_BACKEND=docker",
		"POD_EXECUTOR_IMAGE="+image,
		fmt.Sprintf("RUNNER_FACADE_LISTEN=127.0.0.1:%d", facadePort),
	)
	httpPort := strings.TrimPrefix(c.httpURL, "http://127.0.0.1:")
	c.env = append(c.env, "HTTP_LISTEN=0.0.0.0:"+httpPort)
	c.start()

	gateway := jobNetworkGateway(t, "dynrunner")
	reach := net.JoinHostPort(gateway, fmt.Sprint(facadePort))
	refuse := []string{
		net.JoinHostPort(gateway, fmt.Sprint(natsPort)), net.JoinHostPort(gateway, httpPort),
		net.JoinHostPort(host.Gateway.String(), fmt.Sprint(natsPort)), net.JoinHostPort(host.Gateway.String(), httpPort),
	}
	wf := strings.Replace(dockerWorkflow, "@PROBES@", strings.Join(append([]string{reach}, refuse...), " "), 1)

	began := time.Now()
	res := runWorkflow(t, f, repo, wf, 5*time.Minute)
	t.Logf("job ran in %s", time.Since(began).Round(100*time.Millisecond))
	job, ok := res["hardened"]
	require.True(t, ok, "no job %q in the run: %v", "hardened", keys(res))
	assert.EqualValues(t, "success", job.conclusion, "job concluded %q, want success:\n%s", job.conclusion, tail(job.log, 60))
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)CapEff:\s+0000000000000000$`),
		regexp.MustCompile(`(?m)CapPrm:\s+0000000000000000$`),
		regexp.MustCompile(`(?m)CapBnd:\s+0000000000000000$`),
		regexp.MustCompile(`touch: cannot touch '/should-fail': Read-only file system`),
		regexp.MustCompile(`(?m)touch of / refused$`),
		regexp.MustCompile(`(?m)^4294967296$`), // the default memory limit, 4 GiB
		regexp.MustCompile(`(?m)^4096$`),       // the default pids limit
		regexp.MustCompile(`(?m)uid=1000 home=/home/runner$`),
		regexp.MustCompile(`(?m)the secret is \*\*\*$`),
		regexp.MustCompile(`(?m)reached ` + regexp.QuoteMeta(reach) + `$`),
	} {
		assert.True(t, want.MatchString(job.log), "job log lacks %s", want)
	}
	for _, a := range refuse {
		assert.True(t, strings.Contains(job.log, "refused "+a+"\n"), "the job was not refused %s (the metrics, or a service as a NATS node would be, on an address of the host)", a)
	}
	if t.Failed() {
		t.Logf("job log:\n%s", tail(job.log, 80))
	}

	// Nothing remains: the container is removed once the job ended.
	assertNoContainers(t)
}

// TestDockerBackendJavaScriptAction runs a job that uses a JavaScript action (`using: node20`)
// in a container of the executor image: the runner in host mode runs it with the image's
// Node.js, passes its inputs and reads its output.
func TestDockerBackendJavaScriptAction(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	image := executorImage(t)
	out, err := exec.CommandContext(t.Context(), "docker", "run", "--rm", "--entrypoint", "node", image, "--version").CombinedOutput()
	require.NoError(t, err, "node --version in the executor image: %v\n%s", err, out)
	nodeVersion := strings.TrimSpace(string(out))
	f, _ := startForgeOnHost(t, tools)
	ctx := t.Context()
	action, err := f.CreateRepo(ctx, "greet-action")
	require.NoError(t, err)
	_, err = f.PushFiles(ctx, action, greetAction)
	require.NoError(t, err)
	repo, err := f.CreateRepo(ctx, "js-action")
	require.NoError(t, err)
	c := newController(t, tools, f, repo.String(), leaseEnv, pickupEnv, "POD_BACKEND=docker", "POD_EXECUTOR_IMAGE="+image)
	c.start()

	// By absolute URL: the runner clones the action from the test Gitea, not from
	// DEFAULT_ACTIONS_URL (github.com, out of reach here).
	wf := `name: js-action
on: [push]
jobs:
  node:
    runs-on: [self-hosted, pod]
    steps:
      - run: echo "node $(node --version) at $(command -v node)"
      - id: greet
        uses: ` + f.URL() + "/" + action.String() + `@main
        with:
          who: dynrunner
      - run: echo "the action said ${{ steps.greet.outputs.greeting }}"
`
	res := runWorkflow(t, f, repo, wf, 5*time.Minute)
	job, ok := res["node"]
	require.True(t, ok, "no job %q in the run: %v", "node", keys(res))
	assert.EqualValues(t, "success", job.conclusion, "job concluded %q, want success:\n%s", job.conclusion, tail(job.log, 60))
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^node ` + regexp.QuoteMeta(nodeVersion) + ` at /usr/bin/node(js)?$`),
		regexp.MustCompile(`(?m)^input who=dynrunner$`),
		regexp.MustCompile(`(?m)^the action said hello dynrunner!$`),
	} {
		assert.True(t, want.MatchString(job.log), "job log lacks %s", want)
	}
	if t.Failed() {
		t.Logf("job log:\n%s", tail(job.log, 80))
	}
	assertNoContainers(t)
}

// TestDockerContainerRemovedMidJob removes a job's container while the job runs: the job fails
// in Gitea with a message saying the environment ended, and nothing is left behind.
func TestDockerContainerRemovedMidJob(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	image := executorImage(t)
	f, _ := startForgeOnHost(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "docker-removed")
	require.NoError(t, err)
	c := newController(t, tools, f, repo.String(), leaseEnv, pickupEnv, "POD_BACKEND=docker", "POD_EXECUTOR_IMAGE="+image)
	c.start()
	sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/removed.yml", `name: removed
on: [push]
jobs:
  victim:
    runs-on: [self-hosted, pod]
    steps:
      - run: for i in $(seq 1 600); do echo "tick $i"; sleep 0.1; done
`)
	require.NoError(t, err)
	waitLogged(t, f, repo, sha, "tick 10\n", 2*time.Minute)
	out, err := exec.CommandContext(ctx, "docker", "ps", "-q", "--filter", "label=dynrunner.managed=true", "--filter", "label=dynrunner.scope=default").Output()
	ids := strings.Fields(string(out))
	require.NoError(t, err, "docker ps")
	require.Len(t, ids, 1, "want exactly one job container, have %q", ids)
	out, err = exec.Command("docker", "rm", "-f", ids[0]).CombinedOutput()
	require.NoError(t, err, "docker rm: %s", out)
	run := waitRun(t, f, repo, sha, 5*time.Minute)
	require.Len(t, run.Jobs, 1, "run after the container was removed: %+v", run.Jobs)
	require.EqualValues(t, "failure", run.Jobs[0].Conclusion, "run after the container was removed: %+v", run.Jobs)
	log, err := f.JobLog(ctx, repo, run.Jobs[0].ID)
	require.NoError(t, err)
	require.True(t, strings.Contains(log, "dynrunner: the job failed: the environment"), "the job log does not say the environment ended:\n%s", tail(log, 20))
	assertNoContainers(t)
}

// TestDockerControllerSIGKILLMidJob: with the docker backend, a controller killed mid-job and
// started again adopts the running container; the job finishes with its complete log,
// reported once, and the container is removed.
func TestDockerControllerSIGKILLMidJob(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	image := executorImage(t)
	f, _ := startForgeOnHost(t, tools)
	sigkillMidJob(t, tools, f, nil, "POD_BACKEND=docker", "POD_EXECUTOR_IMAGE="+image)
	assertNoContainers(t)
}

const dockerSPIREWorkflow = `name: docker-spire
on: [push]
jobs:
  attested:
    runs-on: [self-hosted, pod]
    steps:
      - name: workload api
        run: ls /run/spire/sockets/ && echo "SPIFFE_ENDPOINT_SOCKET=${SPIFFE_ENDPOINT_SOCKET:-unset for the job}"
      - name: no svid files
        run: |
          ls -A /run/dynrunner/secrets/
          if [ -e /run/dynrunner/secrets/svid.pem ] || [ -e /run/dynrunner/secrets/svid_key.pem ]; then
            echo "development-CA SVID files in the secrets directory"; exit 1
          fi
          echo "no svid files"
      - name: work
        run: for i in $(seq 1 50); do echo "line $i"; sleep 0.1; done
`

// TestDockerBackendJobWithSPIRE runs a job in a container of the docker pod backend with SPIRE
// instead of the development CA: `dynrunner identity` (IDENTITY_SOURCE=docker) keeps an entry
// per running job container, selected by its labels through the agent's docker workload
// attestor; the controller takes the facade's SVID from the same agent; the executor in the
// container takes the assignment's SVID from the Workload API the backend mounts. The job
// succeeds with no SVID files in its secrets directory, and afterwards neither the container
// nor its entry remains.
func TestDockerBackendJobWithSPIRE(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	image := executorImage(t)
	sp := spiretest.Start(t, kubeTrustDomain)
	runRegistrar(t,
		"IDENTITY_SOURCE=docker",
		"IDENTITY_DOCKER_SOCKET="+dockerSocket,
		"SPIRE_SERVER_SOCKET="+sp.ServerSocket,
		"SPIFFE_TRUST_DOMAIN="+kubeTrustDomain,
		"IDENTITY_PARENT_ID="+sp.AgentID.String(),
		// The controller's own SVID (the facade's identity) comes from the same agent; the job
		// containers run another binary (/usr/local/bin/dynrunner in the image) as uid 1000.
		fmt.Sprintf("IDENTITY_FACADE_SELECTORS=unix:uid:%d,unix:path:%s", os.Getuid(), controllerBin(t)),
		"IDENTITY_SVID_TTL=5m",
		"IDENTITY_RESYNC=5s",
	)
	f, _ := startForgeOnHost(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "docker-spire")
	require.NoError(t, err)
	c := newController(t, tools, f, repo.String(), leaseEnv, pickupEnv,
		"POD_BACKEND=docker",
		"POD_EXECUTOR_IMAGE="+image,
		"SPIFFE_ENDPOINT_SOCKET="+sp.EndpointSocket(),
		"SPIFFE_TRUST_DOMAIN="+kubeTrustDomain,
	)
	c.start()

	began := time.Now()
	sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/spire.yml", dockerSPIREWorkflow)
	require.NoError(t, err)
	// The job's container, its entry, and the executor's log of the SVID it received.
	var id, wantID string
	var wantSel []string
	deadline := time.Now().Add(2 * time.Minute)
	for id == "" {
		out, err := exec.CommandContext(ctx, "docker", "ps", "--no-trunc", "--format", `{{.ID}} {{.Label "dynrunner.task"}} {{.Label "dynrunner.epoch"}}`,
			"--filter", "label=dynrunner.managed=true", "--filter", "label=dynrunner.scope=default").Output()
		require.NoError(t, err, "docker ps")
		if f := strings.Fields(string(out)); len(f) == 3 {
			task, err1 := assignment.ParseTaskID(f[1])
			epoch, err2 := assignment.ParseEpoch(f[2])
			require.NoError(t, err1, "job container labels %q", out)
			require.NoError(t, err2, "job container labels %q", out)
			id, wantID = f[0], workload.AssignmentID(sp.TrustDomain, task, epoch).String()
			wantSel = []string{"docker:label:dynrunner.epoch:" + f[2], "docker:label:dynrunner.scope:default", "docker:label:dynrunner.task:" + f[1]}
		} else {
			require.LessOrEqual(t, len(f), 3, "more than one job container: %q", out)
		}
		if time.Now().After(deadline) {
			require.Fail(t, "no job container within 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("container %s running %s after %s", id[:12], wantID, time.Since(began).Round(100*time.Millisecond))
	var entry *spiretest.Entry
	var logs []byte
	for entry == nil || !bytes.Contains(logs, []byte("SVID received")) || !bytes.Contains(logs, []byte(wantID)) {
		for _, en := range sp.Entries(t) {
			if en.ID == "dynrunner-ctr-"+id {
				entry = &en
			}
		}
		logs, _ = exec.CommandContext(ctx, "docker", "logs", id).CombinedOutput()
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "within 2 minutes: entry %+v; the executor's log:\n%s", entry, tail(string(logs), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	assert.Equal(t, wantID, entry.SPIFFEID.String(), "entry %+v: SPIFFE ID", entry)
	assert.Equal(t, sp.AgentID, entry.ParentID, "entry %+v: parent", entry)
	assert.Equal(t, wantSel, slices.Sorted(slices.Values(entry.Selectors)), "entry %+v: selectors", entry)

	run := waitRun(t, f, repo, sha, 5*time.Minute)
	t.Logf("run concluded %s in %s", run.Conclusion, time.Since(began).Round(100*time.Millisecond))
	require.Len(t, run.Jobs, 1, "run: %+v", run.Jobs)
	require.EqualValues(t, "success", run.Jobs[0].Conclusion, "run: %+v", run.Jobs)
	log, err := f.JobLog(ctx, repo, run.Jobs[0].ID)
	require.NoError(t, err)
	sock := filepath.Base(sp.AgentSocket)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)(^|[ \t])` + regexp.QuoteMeta(sock) + `\s*$`), // ls /run/spire/sockets
		// The executor found its Workload API through SPIFFE_ENDPOINT_SOCKET; the job does not
		// inherit the executor's settings.
		regexp.MustCompile(`SPIFFE_ENDPOINT_SOCKET=unset for the job`),
		regexp.MustCompile(`no svid files`),
		regexp.MustCompile(`line 50`),
	} {
		assert.True(t, want.MatchString(log), "job log lacks %s", want)
	}
	if t.Failed() {
		t.Logf("job log:\n%s", tail(devforge.NormalizeLog(log), 60))
	}

	// Nothing remains: neither the container nor its entry.
	deadline = time.Now().Add(60 * time.Second)
	for {
		left := managedContainers(t)
		var entries []string
		for _, en := range sp.Entries(t) {
			if strings.HasPrefix(en.ID, "dynrunner-ctr-") {
				entries = append(entries, en.ID)
			}
		}
		if len(left) == 0 && len(entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "left behind: containers %v, SPIRE entries %v", left, entries)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
