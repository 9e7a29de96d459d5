package bench

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// needTools returns the cached Gitea and Gitea runner. Without them it skips with the command
// that builds them, except in CI, which provides everything and so fails instead.
func needTools(b *testing.B) devforge.Tools {
	b.Helper()
	if testing.Short() {
		b.Skip("benchmark with a real Gitea and Gitea runner; run without -short")
	}
	tools, err := devforge.FindTools()
	if errors.Is(err, devforge.ErrToolsMissing) && os.Getenv("CI") == "" {
		b.Skipf("%v (outside CI this benchmark skips; in CI it fails)", err)
	}
	require.NoError(b, err)
	return tools
}

// buildDynrunner builds the dynrunner binary into a temporary directory.
func buildDynrunner(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "dynrunner")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/dynrunner/dynrunner/cmd/dynrunner").CombinedOutput()
	require.NoError(b, err, "go build:\n%s", out)
	return bin
}

// controllerProc is a dynrunner controller process on embedded defaults (COMPONENTS=all,
// POD_BACKEND=local, development CA), as an operator would run it on one host.
type controllerProc struct {
	cmd     *exec.Cmd
	done    chan struct{}
	logPath string
}

// startController registers a controller at forge with a registration token of scope and
// waits until it is ready. extra environment variables override the defaults.
func startController(b *testing.B, bin string, tools devforge.Tools, forge *devforge.Forge, scope string, extra ...string) *controllerProc {
	b.Helper()
	dir := b.TempDir()
	// As root, local environments run under uids of their own, which must pass through every
	// directory above STATE_DIR; b.TempDir's parent is 0700.
	require.NoError(b, os.Chmod(filepath.Dir(dir), 0o711))
	tok, err := forge.RunnerRegistrationToken(b.Context(), scope)
	require.NoError(b, err)
	regFile := filepath.Join(dir, "registration-token")
	require.NoError(b, secretfile.WriteNew(regFile, []byte(tok)))
	ports := freePorts(b, 3)
	c := &controllerProc{logPath: filepath.Join(dir, "controller.log"), done: make(chan struct{})}
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(b, err)
	defer logf.Close()
	c.cmd = exec.Command(bin, "controller")
	c.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"STATE_DIR=" + filepath.Join(dir, "state"),
		"GITEA_URL=" + forge.URL(),
		"GITEA_RUNNER_REGISTRATION_TOKEN_FILE=" + regFile,
		"GITEA_RUNNER_NAME=dynrunner-bench",
		"GITEA_RUNNER_BIN=" + tools.RunnerBin,
		"GITEA_RUNNER_SHA256=" + tools.RunnerSHA256,
		"GITEA_RUNNER_VERSION=" + tools.RunnerVersion,
		fmt.Sprintf("HTTP_LISTEN=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("RUNNER_FACADE_LISTEN=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("NATS_EMBEDDED_LISTEN=127.0.0.1:%d", ports[2]),
	}, extra...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	require.NoError(b, c.cmd.Start())
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	b.Cleanup(c.stop)

	ready := fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[0])
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-c.done:
			b.Fatalf("controller exited during start:\n%s", c.logTail(40))
		default:
		}
		if resp, err := http.Get(ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return c
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("controller not ready within 60s:\n%s", c.logTail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits (bounded) for the controller to exit.
func (c *controllerProc) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func (c *controllerProc) logTail(n int) string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func freePorts(b *testing.B, n int) []int {
	b.Helper()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		defer l.Close() // held until all are picked, so no port repeats
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
