package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/gitea"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// statusTTL is the test's LIVENESS_TTL: a killed process leaves the fleet within it.
const statusTTL = 4 * time.Second

// natsUsers are the NATS users of deploy/nats/permissions.conf, by the kind that uses each.
var natsUsers = map[string]string{
	liveness.KindScheduler: "dynrunner-scheduler", liveness.KindFacade: "dynrunner-facade",
	liveness.KindPodWorker: "dynrunner-pod-worker", "status": "dynrunner-status",
}

// startPermissionedNATS starts an in-process nats-server with JetStream, configured with
// exactly deploy/nats/permissions.conf, and writes each user's password to a file in secrets.
func startPermissionedNATS(t *testing.T, secrets string) *server.Server {
	t.Helper()
	for _, user := range natsUsers {
		pw := randomKey(t)
		t.Setenv(strings.ToUpper(strings.ReplaceAll(user, "-", "_"))+"_PASSWORD", pw)
		require.NoError(t, secretfile.WriteNew(filepath.Join(secrets, user+".password"), []byte(pw)))
	}
	t.Setenv("DYNRUNNER_VM_WORKER_PASSWORD", randomKey(t))
	t.Setenv("DYNRUNNER_VM_HOST_PASSWORD", randomKey(t))
	opts, err := server.ProcessConfigFile("../deploy/nats/permissions.conf")
	require.NoError(t, err)
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(s.Shutdown)
	return s
}

// newComponent prepares a controller process that runs one component kind against the NATS
// server at natsURL as that kind's user, acting as the runner whose credentials are in secrets.
func newComponent(t *testing.T, name, kind, forgeURL, natsURL, secrets string, tools devforge.Tools) *controller {
	t.Helper()
	dir := t.TempDir()
	// As root, local environments run under uids of their own, which must pass through every
	// directory above STATE_DIR; t.TempDir's parent is 0700.
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o711))
	httpPort, facadePort := freePort(t), freePort(t)
	c := &controller{t: t, httpURL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), logPath: filepath.Join(dir, "controller.log")}
	c.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"COMPONENTS=" + kind,
		"STATE_DIR=" + filepath.Join(dir, "state"),
		"NATS_URL=" + natsURL,
		"NATS_USER=" + natsUsers[kind],
		"NATS_PASSWORD_FILE=" + filepath.Join(secrets, natsUsers[kind]+".password"),
		"GITEA_URL=" + forgeURL,
		"GITEA_RUNNER_UUID_FILE=" + filepath.Join(secrets, "runner-uuid"),
		"GITEA_RUNNER_TOKEN_FILE=" + filepath.Join(secrets, "runner-token"),
		"GITEA_RUNNER_BIN=" + tools.RunnerBin,
		"GITEA_RUNNER_SHA256=" + tools.RunnerSHA256,
		"GITEA_RUNNER_VERSION=" + tools.RunnerVersion,
		"TASK_ENCRYPTION_KEY_FILE=" + filepath.Join(secrets, "task.key"),
		"RUNNER_FACADE_CAPABILITY_KEY_FILE=" + filepath.Join(secrets, "capability.key"),
		fmt.Sprintf("HTTP_LISTEN=127.0.0.1:%d", httpPort),
		fmt.Sprintf("RUNNER_FACADE_LISTEN=127.0.0.1:%d", facadePort),
		fmt.Sprintf("RUNNER_FACADE_URL=https://127.0.0.1:%d", facadePort),
		"LIVENESS_TTL=" + statusTTL.String(),
		"FETCH_INTERVAL=300ms",
		leaseEnv, pickupEnv,
	}
	t.Cleanup(func() {
		c.stop()
		raceCheck(t, name, c.logPath)
		if t.Failed() {
			if b, err := os.ReadFile(c.logPath); err == nil {
				t.Logf("%s log (%s):\n%s", name, c.httpURL, tail(string(b), 40))
			}
		}
	})
	return c
}

// status runs `dynrunner status --json` against the NATS server as dynrunner-status and returns
// its report, and its error (the exit status and stderr) when it exited non-zero.
func status(t *testing.T, natsURL, secrets string) (fleet.Report, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), controllerBin(t), "status", "--json")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "NATS_URL=" + natsURL,
		"NATS_USER=dynrunner-status", "NATS_PASSWORD_FILE=" + filepath.Join(secrets, "dynrunner-status.password")}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var r fleet.Report
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &r), "dynrunner status --json printed %q (%v, stderr %q)", stdout.String(), runErr, stderr.String())
	if runErr != nil {
		return r, fmt.Errorf("%w: %s", runErr, stderr.String())
	}
	return r, nil
}

// instances lists the instances of kind in r.
func instances(r fleet.Report, kind string) []string {
	var out []string
	for _, c := range r.Components {
		if c.Kind == kind {
			out = append(out, c.Instance)
		}
	}
	return out
}

// processInstance is how the instance a controller process beats as begins: its actor
// (host/pid/random) made a key (liveness.Instance).
func processInstance(t *testing.T, c *controller) string {
	t.Helper()
	return liveness.Instance(fmt.Sprintf("%s/%d/", hostname(t), c.cmd.Process.Pid))
}

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	require.NoError(t, err)
	return h
}

// TestStatusOfSplitDeployment runs dynrunner split as it runs over several hosts: two schedulers,
// two facades and two pod workers, each its own process with its own COMPONENTS and its own NATS
// user, against one NATS server configured with deploy/nats/permissions.conf. `dynrunner status`,
// as the read-only user dynrunner-status, lists every one of them; a pod worker killed with
// SIGKILL leaves the list once its heartbeat expired (LIVENESS_TTL), a scheduler stopped with
// SIGTERM at once; with every facade stopped, status fails and says that no facade is alive.
func TestStatusOfSplitDeployment(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)

	secrets := splitSecrets(t, f, "dynrunner-split")
	ns := startPermissionedNATS(t, secrets)
	natsURL := ns.ClientURL()

	// Before anything runs, status says what is missing and fails.
	_, err := status(t, natsURL, secrets)
	require.Error(t, err, "status of an empty fleet")
	assert.Contains(t, err.Error(), "no scheduler is alive")
	assert.Contains(t, err.Error(), "no facade is alive")

	procs := map[string]*controller{}
	kinds := map[string]string{}
	for _, p := range []struct{ name, kind string }{
		{"scheduler-a", liveness.KindScheduler}, {"scheduler-b", liveness.KindScheduler},
		{"facade-a", liveness.KindFacade}, {"facade-b", liveness.KindFacade},
		{"pod-worker-a", liveness.KindPodWorker}, {"pod-worker-b", liveness.KindPodWorker},
	} {
		procs[p.name], kinds[p.name] = newComponent(t, p.name, p.kind, f.URL(), natsURL, secrets, tools), p.kind
	}
	// The first scheduler creates the topology (the other users may only look it up).
	procs["scheduler-a"].start()
	for _, name := range []string{"scheduler-b", "facade-a", "facade-b", "pod-worker-a", "pod-worker-b"} {
		procs[name].start()
	}
	has := func(r fleet.Report, name string) bool {
		prefix := processInstance(t, procs[name])
		for _, inst := range instances(r, kinds[name]) {
			if strings.HasPrefix(inst, prefix) {
				return true
			}
		}
		return false
	}

	var r fleet.Report
	require.Eventually(t, func() bool {
		r, err = status(t, natsURL, secrets)
		return err == nil && len(r.Components) == 6
	}, time.Minute, 200*time.Millisecond, "status does not list six components")
	for name := range procs {
		assert.True(t, has(r, name), "status lists %s", name)
	}
	assert.Equal(t, map[string]int{"scheduler": 2, "facade": 2, "pod-worker": 2, "vm-worker": 0}, r.Count)
	assert.Empty(t, r.Missing)
	assert.Equal(t, liveness.WorkerInfo{Capacity: 8}, r.Capacity["pod"], "two pod workers of POD_CONCURRENCY 4, idle")
	for _, c := range r.Components {
		assert.Equal(t, hostname(t), c.Host)
		assert.NotEmpty(t, c.Version)
		assert.False(t, c.StartedAt.IsZero())
		if c.Facade != nil {
			assert.True(t, strings.HasPrefix(c.Facade.URL, "https://127.0.0.1:"), c.Facade.URL)
		}
	}
	require.Eventually(t, func() bool {
		r, err = status(t, natsURL, secrets)
		held := 0
		for _, c := range r.Components {
			if c.Scheduler != nil && c.Scheduler.ReconcileLease {
				held++
			}
		}
		return err == nil && held == 1
	}, time.Minute, 200*time.Millisecond, "not exactly one scheduler reports the reconcile lease")

	// A controller's /status carries the same fleet.
	resp, err := http.Get(procs["facade-a"].httpURL + "/status")
	require.NoError(t, err)
	var sr struct {
		Fleet *fleet.Report `json:"fleet"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&sr))
	resp.Body.Close()
	require.NotNil(t, sr.Fleet, "/status without a fleet")
	assert.Len(t, sr.Fleet.Components, 6)

	// SIGTERM: the scheduler deletes its heartbeat as it stops.
	procs["scheduler-b"].stop()
	r, err = status(t, natsURL, secrets)
	require.NoError(t, err)
	assert.False(t, has(r, "scheduler-b"), "a stopped scheduler is still listed")
	assert.Len(t, r.Components, 5)

	// SIGKILL: the pod worker's heartbeat expires with LIVENESS_TTL.
	killed := time.Now()
	procs["pod-worker-a"].kill()
	require.Eventually(t, func() bool {
		r, err = status(t, natsURL, secrets)
		return err == nil && !has(r, "pod-worker-a")
	}, 2*statusTTL+30*time.Second, 200*time.Millisecond, "a killed pod worker is still listed")
	t.Logf("the killed pod worker left the fleet %s after SIGKILL (LIVENESS_TTL %s)", time.Since(killed).Round(100*time.Millisecond), statusTTL)
	assert.True(t, has(r, "pod-worker-b"))
	assert.Len(t, r.Components, 4)

	// No facade left: status fails and says so.
	procs["facade-a"].stop()
	procs["facade-b"].stop()
	r, err = status(t, natsURL, secrets)
	require.Error(t, err)
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "%v", err)
	assert.NotEqual(t, 0, exit.ExitCode())
	assert.Contains(t, err.Error(), "no facade is alive")
	assert.NotContains(t, err.Error(), "no scheduler is alive")
	assert.Equal(t, []string{liveness.KindFacade}, r.Missing)
}

// splitSecrets registers one runner named name on f and writes what every component process of
// a split deployment shares into a new directory: the runner's credentials and the two keys.
func splitSecrets(t *testing.T, f *devforge.Forge, name string) string {
	t.Helper()
	ctx := t.Context()
	secrets := filepath.Join(t.TempDir(), "secrets")
	require.NoError(t, os.MkdirAll(secrets, 0o700))
	tok, err := f.RunnerRegistrationToken(ctx, "")
	require.NoError(t, err)
	creds, err := gitea.Register(ctx, http.DefaultClient, f.URL(), tok, name, []string{"self-hosted", "pod"}, "e2e")
	require.NoError(t, err)
	for file, data := range map[string]string{"runner-uuid": creds.UUID, "runner-token": creds.Token, "task.key": randomKey(t), "capability.key": randomKey(t)} {
		require.NoError(t, secretfile.WriteNew(filepath.Join(secrets, file), []byte(data)))
	}
	return secrets
}
