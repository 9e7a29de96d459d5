package podworker_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/local"
)

// The test binary doubles as the executor of the environments the local backend starts: with
// environOut set it writes the environment it was started with into that directory
// (environFile) and exits.
const (
	environOut  = "DYNRUNNER_PODWORKER_TEST_ENVIRON_OUT"
	environFile = "environ.json"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(environOut); dir != "" {
		os.Exit(writeEnviron(dir))
	}
	os.Exit(m.Run())
}

// writeEnviron writes the process's environment as JSON into dir, atomically.
func writeEnviron(dir string) int {
	b, err := json.Marshal(os.Environ())
	if err == nil {
		tmp := filepath.Join(dir, environFile+".tmp")
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, filepath.Join(dir, environFile))
		}
	}
	if err != nil {
		_, _ = os.Stderr.WriteString("write environ: " + err.Error() + "\n")
		return 10
	}
	return 0
}

// TestWorkerEnvironParses: the environment a worker and its backend give an executor, as the
// started process sees it, is what executor.ParseEnv reads: the controller's configuration,
// the assignment's task, epoch and forge URL, and the backend's directories.
func TestWorkerEnvironParses(t *testing.T) {
	out, root := t.TempDir(), t.TempDir()
	exe, err := os.Executable()
	require.NoError(t, err)
	backend, err := local.New(local.Config{
		Root: root, Command: []string{exe},
		BaseEnv: []string{"PATH=" + os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0", environOut + "=" + out},
		Log:     zerolog.New(zerolog.NewTestWriter(t)),
	})
	require.NoError(t, err)
	controller := executor.Config{
		FacadeURL: "https://127.0.0.1:8443,https://127.0.0.2:8443",
		FacadeID:  spiffeid.RequireFromString("spiffe://dynrunner.test/dynrunner/facade"),
		Labels:    executor.Labels(assignment.BackendPod), Renew: 100 * time.Second,
		RunnerBin: "/opt/gitea-runner", RunnerSHA256: strings.Repeat("ab", 32), RunnerVersion: "v1.0.8",
		SpiffeEndpointSocket: "unix:///run/spire/agent.sock", LogFormat: "console",
	}
	r := newRig(t)
	r.runWorker(r.log, backend, podworker.Config{Actor: "worker-test", Reap: time.Hour, ExecutorEnv: controller.Environ()})
	const forge = assignment.ForgeURL("https://gitea.example.com/sub")
	st, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: 5, At: time.Now(), Actor: "test",
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute, ForgeURL: forge}, nil)
	require.NoError(t, err)
	require.NoError(t, r.log.Dispatch(t.Context(), assignment.BackendPod, 5, st.Epoch()))

	var environ []string
	eventually(t, "the environment's executor wrote its environment", func() bool {
		b, err := os.ReadFile(filepath.Join(out, environFile))
		if errors.Is(err, fs.ErrNotExist) {
			return false
		}
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &environ))
		return true
	})
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	got, err := executor.ParseEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	want := controller
	dir := filepath.Join(root, "5-"+st.Epoch().String())
	want.Task, want.Epoch, want.ForgeURL = 5, st.Epoch(), forge
	want.SecretsDir, want.WorkDir = filepath.Join(dir, "secrets"), filepath.Join(dir, "work")
	assert.Equal(t, want, got)
	assert.Equal(t, dir, env[executor.EnvEnvDir])
}
