package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/forge"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// facadeHostVar, when set, makes this test binary a facade host: `COMPONENTS=facade` of
// BenchmarkMemory10k/split, against the benchmark's embedded server. Its value is the host's
// facadeHostConfig as JSON.
const facadeHostVar = "DYNRUNNER_BENCH_FACADE_HOST"

// facadeHostConfig is what a facade host runs against: the plane's JetStream, its development
// CA and its lease.
type facadeHostConfig struct {
	NATSURL string
	CADir   string
	Lease   time.Duration
	// Forge: reports reach a fakeForge in the host, whose count of successes the host prints
	// when it stops ("successes <n>"); without it they are refused (noForge).
	Forge bool
}

// facadeHostMain runs in the child: a view and the facade on mTLS on loopback, as a
// `COMPONENTS=facade` controller wires them. It prints "ready <url>" once serving, and runs
// until its stdin closes.
func facadeHostMain() int {
	var cfg facadeHostConfig
	if err := json.Unmarshal([]byte(os.Getenv(facadeHostVar)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "facade host: config:", err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var fg forge.Forge = noForge{}
	counting := newFakeForge()
	if cfg.Forge {
		fg = counting
	}
	stop, err := runFacadeHost(ctx, cfg, fg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "facade host:", err)
		return 1
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	stop()
	fmt.Println("successes", counting.successes.Load())
	return 0
}

// runFacadeHost starts the facade and prints its URL; stop ends it.
func runFacadeHost(ctx context.Context, cfg facadeHostConfig, fg forge.Forge) (stop func(), err error) {
	c, _, l, err := openLog(ctx, natsconn.Config{URL: cfg.NATSURL, User: planeNATSUser, Password: planeNATSPassword, Name: "facade-host"}, benchTaskKey, 0)
	if err != nil {
		return nil, err
	}
	ca, err := workload.LoadOrCreateDevCA(cfg.CADir, benchTD)
	if err != nil {
		return nil, err
	}
	box, err := sealbox.New(benchTaskKey)
	if err != nil {
		return nil, err
	}
	issuer, err := captoken.NewIssuer(benchCapKey)
	if err != nil {
		return nil, err
	}
	logger := controllerLogger(os.Stderr).With().Str("component", "facade").Logger()
	view := eventlog.NewView()
	f := facade.New(facade.Config{
		Actor: "facade@bench-host", TrustDomain: benchTD, Lease: cfg.Lease, Issuer: issuer,
		RunnerKey: benchRunnerKey, Box: box, Log: logger,
	}, fg, l, view)
	srv, err := facadeServer(f, ca, benchTD)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Watch(runCtx, view) })
	select {
	case <-view.Ready():
	case <-time.After(time.Minute):
		cancel()
		return nil, errors.New("view not ready within 1m")
	}
	wg.Go(func() { _ = srv.ServeTLS(ln, "", "") })
	fmt.Println("ready https://" + ln.Addr().String())
	return func() {
		cancel()
		_ = srv.Close()
		wg.Wait()
		c.Close()
	}, nil
}

// noForge is the facade host's forge. BenchmarkMemory10k's environments hold after
// FetchTask, which the facade answers from JetStream, so no report reaches the forge; one
// that did is refused, and the environment that sent it fails the benchmark.
type noForge struct{}

var errNoForge = errors.New("bench facade host: no forge: BenchmarkMemory10k's environments send no reports")

func (noForge) FetchTask(context.Context, int64) (*runnerv1.FetchTaskResponse, error) {
	return nil, errNoForge
}

func (noForge) UpdateTask(context.Context, *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	return nil, errNoForge
}

func (noForge) UpdateLog(context.Context, *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	return nil, errNoForge
}

// facadeHost is the parent's side of a facade host process.
type facadeHost struct {
	cmd  *exec.Cmd
	url  string
	stop sync.Once
	in   io.Closer
	out  *bufio.Reader
	// last is what the host printed after its stdin closed ("successes <n>").
	last string
}

// startFacadeHost starts this test binary as a facade host for p, which must serve its
// embedded server (newListeningPlane), and points p's environments at it. With forge set,
// the host forwards reports to a fakeForge of its own (successes counts them).
func startFacadeHost(b *testing.B, p *plane, lease time.Duration, forge bool) *facadeHost {
	b.Helper()
	require.NotEmpty(b, p.natsListen, "a facade host needs the plane's server on loopback (newListeningPlane)")
	exe, err := os.Executable()
	require.NoError(b, err)
	cfg, err := json.Marshal(facadeHostConfig{NATSURL: "nats://" + p.natsListen, CADir: p.caDir, Lease: lease, Forge: forge})
	require.NoError(b, err)
	logPath := filepath.Join(b.TempDir(), "facadehost.log")
	logf, err := os.Create(logPath)
	require.NoError(b, err)
	b.Cleanup(func() { _ = logf.Close() })
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), facadeHostVar+"="+string(cfg))
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	require.NoError(b, err)
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	h := &facadeHost{cmd: cmd, in: in, out: bufio.NewReader(out)}
	b.Cleanup(h.close)
	line, err := h.out.ReadString('\n')
	if err != nil {
		tail, _ := os.ReadFile(logPath)
		require.NoError(b, err, "facade host did not start: %s", tail)
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	require.True(b, ok, "facade host said %q, want ready <url>", line)
	h.url = url
	p.target.URL = url
	return h
}

func (h *facadeHost) pid() string { return strconv.Itoa(h.cmd.Process.Pid) }

// close ends the host (closing its stdin) and waits for it. It is idempotent.
func (h *facadeHost) close() {
	h.stop.Do(func() {
		_ = h.in.Close()
		last, _ := h.out.ReadString('\n')
		h.last = strings.TrimSpace(last)
		_ = h.cmd.Wait()
	})
}

// successes stops the host and returns how many successes its forge saw.
func (h *facadeHost) successes() (int64, error) {
	h.close()
	n, ok := strings.CutPrefix(h.last, "successes ")
	if !ok {
		return 0, fmt.Errorf("facade host said %q when it stopped, want successes <n>", h.last)
	}
	return strconv.ParseInt(n, 10, 64)
}
