package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/testbed/netnstest"
)

// The package's tests use two dynrunner binaries, each built once: a static one that the
// images carry (the executor image, the microVM guest), and the one every process on the host
// runs (controller, identity, events), built with the race detector so that the controller-level
// tests also check the controller for data races (raceCheck).
var (
	staticBin = onceBinary{flags: []string{"-trimpath"}, env: []string{"CGO_ENABLED=0"}}
	hostBin   = onceBinary{flags: []string{"-race"}, env: []string{"CGO_ENABLED=1"}}
)

type onceBinary struct {
	flags []string
	env   []string
	once  sync.Once
	path  string
	err   error
}

func (b *onceBinary) build(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "dynrunner-e2e-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "dynrunner")
		args := append(append([]string{"build"}, b.flags...), "-o", b.path, "github.com/dynrunner/dynrunner/cmd/dynrunner")
		build := exec.Command("go", args...)
		build.Env = append(os.Environ(), b.env...)
		if out, err := build.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	})
	require.NoError(t, b.err)
	return b.path
}

// dynrunnerBin is the static binary, for images: the same binary runs as the guest inside the
// test microVM and as the executor in the executor image.
func dynrunnerBin(t testing.TB) string { return staticBin.build(t) }

// controllerBin is the race-enabled binary for processes on the host. The local backend's
// executors and the vm worker's launchers are started from it too (os.Executable).
func controllerBin(t testing.TB) string { return hostBin.build(t) }

// raceReport is how the race detector begins each report it writes to stderr.
const raceReport = "WARNING: DATA RACE"

// raceCheck fails t when the log at path holds a race detector report, with the report.
func raceCheck(t testing.TB, what, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if i := strings.Index(string(b), raceReport); i >= 0 {
		assert.Failf(t, "data race", "%s: the race detector found a data race:\n%s", what, head(string(b[i:]), 80))
	}
}

func head(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// needTools returns the cached Gitea and runner, skipping (failing in CI) when missing.
func needTools(t testing.TB) devforge.Tools {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test with a real Gitea and Gitea runner; run without -short")
	}
	tools, err := devforge.FindTools()
	if errors.Is(err, devforge.ErrToolsMissing) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	require.NoError(t, err)
	return tools
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// controller is a dynrunner controller process.
type controller struct {
	t       testing.TB
	bin     string // the binary; empty: controllerBin, built with the race detector
	env     []string
	httpURL string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
}

// newController prepares a controller on embedded defaults against forge, registering with a
// registration token of scope.
func newController(t testing.TB, tools devforge.Tools, forge *devforge.Forge, scope string, extra ...string) *controller {
	t.Helper()
	dir := t.TempDir()
	// As root, local environments run under uids of their own, which must pass through every
	// directory above STATE_DIR; t.TempDir's parent is 0700.
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o711))
	tok, err := forge.RunnerRegistrationToken(t.Context(), scope)
	require.NoError(t, err)
	regFile := filepath.Join(dir, "registration-token")
	require.NoError(t, secretfile.WriteNew(regFile, []byte(tok)))
	httpPort := freePort(t)
	c := &controller{t: t, httpURL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), logPath: filepath.Join(dir, "controller.log")}
	c.env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"STATE_DIR=" + filepath.Join(dir, "state"),
		"GITEA_URL=" + forge.URL(),
		"GITEA_RUNNER_REGISTRATION_TOKEN_FILE=" + regFile,
		"GITEA_RUNNER_NAME=dynrunner-e2e",
		"GITEA_RUNNER_BIN=" + tools.RunnerBin,
		"GITEA_RUNNER_SHA256=" + tools.RunnerSHA256,
		"GITEA_RUNNER_VERSION=" + tools.RunnerVersion,
		fmt.Sprintf("HTTP_LISTEN=127.0.0.1:%d", httpPort),
		fmt.Sprintf("RUNNER_FACADE_LISTEN=127.0.0.1:%d", freePort(t)),
		fmt.Sprintf("NATS_EMBEDDED_LISTEN=127.0.0.1:%d", freePort(t)),
		"FETCH_INTERVAL=300ms",
	}, extra...)
	t.Cleanup(func() {
		c.stop()
		raceCheck(t, "controller", c.logPath)
		if t.Failed() {
			if b, err := os.ReadFile(c.logPath); err == nil {
				t.Logf("controller log:\n%s", tail(string(b), 150))
			}
		}
	})
	return c
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// start runs the controller process and waits until /readyz answers 200.
func (c *controller) start() {
	c.t.Helper()
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(c.t, err)
	defer logf.Close()
	bin := c.bin
	if bin == "" {
		bin = controllerBin(c.t)
	}
	c.cmd = exec.Command(bin, "controller")
	c.cmd.Env = c.env
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	require.NoError(c.t, c.cmd.Start())
	c.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(c.cmd, c.done)
	waitReady(c.t, "controller", c.httpURL+"/readyz", c.done, c.logPath)
}

// waitReady polls url until it answers 200, for at most 60 s; it fails the test, with the end
// of the log at logPath, when done closes first (the process exited).
func waitReady(t testing.TB, what, url string, done <-chan struct{}, logPath string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			require.Failf(t, "exited", "%s exited during start:\n%s", what, tail(string(b), 40))
		default:
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "%s not ready within 60s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill SIGKILLs the controller, as a crash would.
func (c *controller) kill() {
	c.t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop sends SIGTERM and waits (bounded) for a clean exit.
func (c *controller) stop() {
	if c.cmd == nil || c.done == nil {
		return
	}
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		assert.Fail(c.t, "controller did not stop within 30s of SIGTERM")
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// startForge starts a development Gitea for one test.
func startForge(t testing.TB, tools devforge.Tools) *devforge.Forge {
	t.Helper()
	f, err := devforge.Start(t.Context(), tools, devforge.Options{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// startForgeOnHost starts a development Gitea on a host of its own (a network namespace): not
// loopback, as in production, so job containers on the isolated job network reach it the way
// they reach a forge elsewhere.
func startForgeOnHost(t testing.TB, tools devforge.Tools) (*devforge.Forge, *netnstest.Host) {
	t.Helper()
	host := netnstest.New(t)
	f, err := devforge.Start(t.Context(), tools, devforge.Options{Dir: t.TempDir(), Netns: host.Name, Addr: host.Addr.String()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f, host
}

func waitRun(t testing.TB, f *devforge.Forge, repo devforge.Repo, sha string, limit time.Duration) devforge.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	run, err := f.WaitRun(ctx, repo, sha)
	require.NoError(t, err)
	return run
}
