package vmworker_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/launcher"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/local"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
	"github.com/dynrunner/dynrunner/vmworker"
)

// launcherEnv makes the test binary act as `dynrunner launcher` (cmd/dynrunner/launcher.go),
// configured through DYNRUNNER_LAUNCH_* exactly as the vm worker configures the command.
const launcherEnv = "DYNRUNNER_VMWORKER_TEST_LAUNCHER"

func TestMain(m *testing.M) {
	if os.Getenv(launcherEnv) == "1" {
		os.Exit(runLauncher())
	}
	os.Exit(m.Run())
}

// runLauncher mirrors cmd/dynrunner/launcher.go.
func runLauncher() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := launcher.ParseFlags(nil, os.Getenv, os.Stderr)
	if err == nil {
		log := zerolog.New(os.Stderr).With().Timestamp().Str("component", "launcher").Logger()
		err = launcher.Launch(ctx, cfg, log)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s%s\n", podworker.LauncherErrorPrefix, strings.TrimPrefix(err.Error(), "launcher: "))
	}
	return launcher.ExitCode(err)
}

// requireVM skips when the VM tier cannot run here, naming what provides it; in CI (CI set),
// which provides everything, it fails instead.
func requireVM(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots microVMs under QEMU TCG; run without -short")
	}
	missing := func(what string) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("%s although CI must provide the VM tier (scripts/vm-deps.sh, run as root)", what)
		}
		t.Skipf("%s; the VM tier needs root and the tools of: bash scripts/vm-deps.sh", what)
	}
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "genisoimage", "ip", "cpio", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing(tool + " is missing")
		}
	}
	if out, err := exec.Command("busybox", "--list").Output(); err != nil || !bytes.Contains(out, []byte("insmod")) {
		missing("busybox-static is missing")
	}
	if os.Geteuid() != 0 {
		missing("not root (the launcher creates TAP devices on a bridge)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		missing("/dev/net/tun is missing")
	}
}

// directIODir returns a new directory on a file system that takes O_DIRECT, which the
// launcher opens its disks with (tmpfs does not).
func directIODir(t *testing.T) string {
	t.Helper()
	bases := []string{os.TempDir()}
	if home, err := os.UserHomeDir(); err == nil {
		bases = append(bases, filepath.Join(home, ".cache", "dynrunner"))
	}
	for _, base := range bases {
		if os.MkdirAll(base, 0o755) != nil {
			continue
		}
		dir, err := os.MkdirTemp(base, "vmc-")
		if err != nil {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_RDWR|syscall.O_DIRECT, 0o600)
		if err == nil {
			_ = f.Close()
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			return dir
		}
		_ = os.RemoveAll(dir)
	}
	t.Fatalf("no directory on a file system that takes O_DIRECT below %v", bases)
	return ""
}

// record is what the VM backend gave its launcher processes: each launcher's environment and
// files, and the instance ids per handle.
type record struct {
	mu        sync.Mutex
	sent      [][]byte
	instances map[string][]string
}

// recorder is the launcher process backend (podworker/local), recording into a record every
// backend instance of a test shares.
type recorder struct {
	vmworker.Launcher
	*record
}

func (r recorder) Start(ctx context.Context, spec podworker.Spec) (podworker.Handle, error) {
	h, err := r.Launcher.Start(ctx, spec)
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, v := range spec.Env {
		r.sent = append(r.sent, []byte(k+"="+v))
	}
	for name, b := range spec.Files {
		r.sent = append(r.sent, []byte(name), b)
	}
	if err == nil {
		r.instances[h.ID] = append(r.instances[h.ID], spec.Env[launcher.EnvInstanceID])
	}
	return h, err
}

// Diagnose passes the launcher's error line through.
func (r recorder) Diagnose(ctx context.Context, h podworker.Handle) (string, error) {
	return r.Launcher.(podworker.Diagnoser).Diagnose(ctx, h)
}

func (r *record) instancesOf(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.instances[id]...)
}

// launcherVar reads variable name from the environment of the launcher process of h.
func launcherVar(t *testing.T, h podworker.Handle, name string) string {
	t.Helper()
	environ, err := os.ReadFile("/proc/" + h.Data["pid"] + "/environ")
	require.NoError(t, err, "the environment of launcher %s", h.ID)
	for kv := range bytes.SplitSeq(environ, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(name+"=")); ok {
			return string(v)
		}
	}
	require.Failf(t, "launcher variable missing", "%s is not in the environment of launcher %s", name, h.ID)
	return ""
}

// withoutVM is why the file checks do not apply to a microVM.
const withoutVM = "spec.Files never reach the microVM: the guest redeems a single-use nonce for the capability token (see TokenOnlyThroughNonce)"

// TestConformance runs the backend conformance suite against the default VM backend: the
// vm worker's Backend starting launcher processes (podworker/local), each booting the test
// guest (scripts/vm-test-image.sh) under QEMU TCG on a bridge of its own, with the real nonce
// store and the real nonce endpoint's handler on the bridge.
func TestConformance(t *testing.T) {
	requireVM(t)
	began := time.Now()
	img := t.TempDir()
	out, err := exec.Command("bash", "../scripts/vm-test-image.sh", img).CombinedOutput()
	require.NoError(t, err, "scripts/vm-test-image.sh:\n%s", out)
	cmdline, err := os.ReadFile(filepath.Join(img, "cmdline"))
	require.NoError(t, err)

	root := directIODir(t)
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	bridge := "drc" + hex.EncodeToString(rnd[:])
	cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, 150 + rnd[0]%50, 1}), 24)
	require.NoError(t, launcher.EnsureBridge(t.Context(), filepath.Join(root, "vms"), bridge, cidr))
	t.Cleanup(func() {
		assert.NoError(t, exec.Command("ip", "link", "delete", "dev", bridge).Run(), "delete the test bridge")
	})

	// The nonce endpoint's handler on the bridge: guests in ping mode fetch /v1/ping from the
	// endpoint their seed names.
	l, _ := eventlogtest.Open(t)
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	nonces := vmworker.NewNonces(l.Nonces(), box)
	ln, err := net.Listen("tcp", netip.AddrPortFrom(cidr.Addr(), 0).String())
	require.NoError(t, err)
	ep, err := vmworker.NewEndpoint(vmworker.EndpointConfig{
		Listen: ln.Addr().String(), Allowed: cidr, Log: zerolog.New(zerolog.NewTestWriter(t)),
	}, nonces, nil)
	require.NoError(t, err)
	var pings atomic.Int64
	handler := ep.Handler()
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/ping" {
			pings.Add(1)
		}
		handler.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	launch := launcher.Config{
		Image: filepath.Join(img, "base.qcow2"), Kernel: filepath.Join(img, "vmlinuz"), Initramfs: filepath.Join(img, "initramfs.cpio.gz"),
		Hypervisor: launcher.HypervisorQEMU, CPUs: 1, MemoryMiB: 256, DiskGiB: 1,
		Bridge: bridge, BridgeCIDR: cidr, Root: filepath.Join(root, "vms"), Deadline: 5 * time.Minute,
	}.Environ()
	// Each spec says what its guest does (the kernel command line) and for how long it may run.
	delete(launch, launcher.EnvName("cmdline"))
	delete(launch, launcher.EnvName("deadline"))
	endpointURL := "http://" + ln.Addr().String()
	rec := &record{instances: map[string][]string{}}
	launchers := filepath.Join(root, "launchers")
	newBackend := func(t *testing.T) podworker.Backend {
		procs, err := local.New(local.Config{
			Root:    launchers,
			Command: []string{os.Args[0]},
			BaseEnv: []string{"PATH=" + os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0", launcherEnv + "=1"},
			Grace:   30 * time.Second,
			Log:     zerolog.New(zerolog.NewTestWriter(t)).With().Str("backend", "launcher").Logger(),
		})
		require.NoError(t, err)
		b, err := vmworker.NewBackend(recorder{Launcher: procs, record: rec}, nonces, endpointURL, launch)
		require.NoError(t, err)
		return b
	}

	spec := func(t *testing.T, task assignment.TaskID, behavior podworkertest.Behavior) podworker.Spec {
		mode, deadline := "hang", "5m"
		switch behavior {
		case podworkertest.RunForever:
		case podworkertest.ExitZero:
			mode = "ping"
		case podworkertest.ExitNonZero:
			// The deadline kills the VM: the launcher exits with launcher.ExitDeadline (3).
			deadline = "5s"
		default:
			require.Failf(t, "unsupported behavior", "no test guest mode for %v", behavior)
		}
		return podworker.Spec{Task: task, Env: map[string]string{
			launcher.EnvName("cmdline"):  strings.TrimSpace(string(cmdline)) + " dynrunner.test=" + mode,
			launcher.EnvName("deadline"): deadline,
		}}
	}

	gone := func(t *testing.T, h podworker.Handle) bool {
		if _, err := os.Lstat(filepath.Join(launchers, h.ID)); !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		for _, inst := range rec.instancesOf(h.ID) {
			id, err := launcher.ParseInstanceID(inst)
			require.NoError(t, err)
			if _, err := os.Lstat(filepath.Join(root, "vms", inst)); !errors.Is(err, fs.ErrNotExist) {
				return false
			}
			if exec.Command("ip", "link", "show", "dev", launcher.TAPName(id)).Run() == nil {
				return false
			}
			ps, _ := exec.Command("ps", "-eo", "args").Output()
			if bytes.Contains(ps, []byte(inst)) {
				return false
			}
		}
		return true
	}

	podworkertest.RunConformance(t, podworkertest.Harness{
		New:            newBackend,
		Spec:           spec,
		Gone:           gone,
		KnownExitCodes: true,
		DiagnosePrefix: podworker.LauncherErrorPrefix,
		Nonce: &podworkertest.NonceHarness{
			Redeem: func(t *testing.T, h podworker.Handle) (string, error) {
				_, _, cred, err := nonces.Redeem(t.Context(), launcherVar(t, h, launcher.EnvInstanceID), launcherVar(t, h, launcher.EnvNonce))
				return cred.Token, err
			},
			Received: func(t *testing.T) [][]byte {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				return append([][]byte(nil), rec.sent...)
			},
		},
		Without: map[string]string{
			podworkertest.CheckSecretFiles:             withoutVM,
			podworkertest.CheckRejectsUnsafeSecretName: withoutVM,
			podworkertest.CheckWriteFiles:              "the job writes inside the VM's own disk, a copy-on-write overlay the launcher removes (launcher tests)",
			podworkertest.CheckNeverReady:              "Start returns once the launcher process runs; a guest that never redeems its nonce is the worker's pickup timeout",
		},
		Timeout: 3 * time.Minute,
	})
	// The test guests of ExitZero and Diagnose configured their network from the seed and
	// reached the endpoint it named.
	assert.GreaterOrEqual(t, pings.Load(), int64(2), "pings from the guests at the endpoint of their seed")
	t.Logf("VM conformance took %s", time.Since(began).Round(time.Second))
}
