package launcher

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vmEnv is the integration environment: the test guest image, a bridge of its own and a nonce
// endpoint on it answering /v1/ping.
type vmEnv struct {
	image, kernel, initramfs, cmdline string
	root                              string
	bridge                            string
	cidr                              netip.Prefix
	endpoint                          Endpoint
	pings                             chan time.Time
}

var (
	imageOnce sync.Once
	imageDir  string
	imageErr  error
)

// requireVM skips (or, in CI, fails) when the VM tier cannot run, naming the command that
// provides what is missing.
func requireVM(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots VMs under QEMU TCG; run without -short")
	}
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "genisoimage", "ip", "cpio", "mkfs.ext4"} {
		if _, err := lookPath(tool); err != nil {
			skipOrFail(t, tool+" is missing")
		}
	}
	if out, err := exec.Command("busybox", "--list").Output(); err != nil || !bytes.Contains(out, []byte("insmod")) {
		skipOrFail(t, "busybox-static is missing")
	}
	if os.Geteuid() != 0 {
		skipOrFail(t, "the VM tier creates bridges and TAP devices and needs root")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		skipOrFail(t, "/dev/net/tun is missing")
	}
}

// testImage builds (cached) the test guest image with scripts/vm-test-image.sh, once per test
// binary.
func testImage(t testing.TB) string {
	t.Helper()
	imageOnce.Do(func() {
		dir, err := os.MkdirTemp("", "launcher-image-")
		if err != nil {
			imageErr = err
			return
		}
		cmd := exec.Command("bash", "../scripts/vm-test-image.sh", dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			imageErr = fmt.Errorf("scripts/vm-test-image.sh: %w\n%s", err, out)
			return
		}
		imageDir = dir
	})
	require.NoError(t, imageErr)
	return imageDir
}

func newVMEnv(t testing.TB) *vmEnv {
	t.Helper()
	requireVM(t)
	img := testImage(t)
	cmdline, err := os.ReadFile(filepath.Join(img, "cmdline"))
	require.NoError(t, err)
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	e := &vmEnv{
		image:     filepath.Join(img, "base.qcow2"),
		kernel:    filepath.Join(img, "vmlinuz"),
		initramfs: filepath.Join(img, "initramfs.cpio.gz"),
		cmdline:   strings.TrimSpace(string(cmdline)),
		root:      directIODir(t),
		bridge:    "drt" + hex.EncodeToString(rnd[:]),
		cidr:      netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, 200 + rnd[0]%50, 1}), 24),
		pings:     make(chan time.Time, 16),
	}
	ctx := context.Background()
	require.NoError(t, ensureBridge(ctx, e.root, e.bridge, e.cidr))
	t.Cleanup(func() {
		_, err := run(context.Background(), "ip", "link", "delete", "dev", e.bridge)
		assert.NoError(t, err, "delete the test bridge")
	})
	ln, err := net.Listen("tcp", netip.AddrPortFrom(e.cidr.Addr(), 0).String())
	require.NoError(t, err)
	e.endpoint = Endpoint{Addr: netip.MustParseAddrPort(ln.Addr().String())}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ping", func(w http.ResponseWriter, r *http.Request) {
		select {
		case e.pings <- time.Now():
		default:
		}
		fmt.Fprintf(w, "pong from %s", r.RemoteAddr)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return e
}

// config returns a Config booting the test guest under QEMU with test mode mode ("ping",
// "hang" or "").
func (e *vmEnv) config(t testing.TB, mode string) Config {
	t.Helper()
	c := DefaultConfig()
	c.InstanceID = InstanceID{b: uuid.New()}
	var nonce [24]byte
	_, _ = rand.Read(nonce[:])
	c.Nonce, _ = ParseNonce(hex.EncodeToString(nonce[:]))
	c.Endpoint = e.endpoint
	c.Image, c.Kernel, c.Initramfs = e.image, e.kernel, e.initramfs
	c.Cmdline = e.cmdline
	if mode != "" {
		c.Cmdline += " dynrunner.test=" + mode
	}
	c.Hypervisor = HypervisorQEMU
	c.CPUs, c.MemoryMiB, c.DiskGiB = 1, 256, 1
	c.Bridge, c.BridgeCIDR = e.bridge, e.cidr
	c.Deadline = 3 * time.Minute
	c.Root = e.root
	return c
}

// env renders c as the DYNRUNNER_LAUNCH_* environment of a launcher process.
func (c Config) env() []string {
	env := []string{childEnvVar + "=1", "PATH=" + os.Getenv("PATH")}
	for k, v := range c.Environ() {
		env = append(env, k+"="+v)
	}
	return env
}

// launcherProc is a launcher running as a child process of the test, as the vm worker runs it.
type launcherProc struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{}
}

func startLauncher(t *testing.T, c Config) *launcherProc {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	p := &launcherProc{stderr: new(bytes.Buffer), done: make(chan struct{})}
	p.cmd = exec.Command(self)
	p.cmd.Env = c.env()
	p.cmd.Stderr = &lockedWriter{w: p.stderr}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

// wait waits for the launcher to exit and returns its exit code.
func (p *launcherProc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		t.Fatalf("the launcher did not exit within %s; stderr:\n%s", within, p.stderr)
		return -1
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// poll calls cond until it is true, up to within.
func poll(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for backoff := 10 * time.Millisecond; !cond(); backoff = min(2*backoff, 250*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(backoff)
	}
}

// waitBooting waits until the hypervisor of the instance in dir runs and the guest has
// written to its serial console.
func waitBooting(t *testing.T, dir string) {
	t.Helper()
	poll(t, 2*time.Minute, "the guest to boot", func() bool {
		fi, err := os.Stat(filepath.Join(dir, serialFile))
		if err != nil || fi.Size() == 0 {
			return false
		}
		for _, pid := range procsWithArgPrefix(dir + "/") {
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && strings.Contains(exe, "qemu-system") {
				return true
			}
		}
		return false
	})
}

// assertGone checks that nothing of instance c remains: directory, lease, TAP device,
// hypervisor process.
func assertGone(t *testing.T, c Config) {
	t.Helper()
	dir := filepath.Join(c.Root, c.InstanceID.String())
	_, err := os.Lstat(dir)
	left, _ := os.ReadDir(dir)
	assert.ErrorIs(t, err, os.ErrNotExist, "instance directory remains: %v", left)
	leases, _ := os.ReadDir(filepath.Join(c.Root, leasesDir))
	for _, l := range leases {
		if owner, ok := leaseOwner(filepath.Join(c.Root, leasesDir, l.Name())); ok {
			assert.NotEqual(t, c.InstanceID, owner, "lease %s remains", l.Name())
		}
	}
	tap, err := exec.Command("ip", "link", "show", "dev", TAPName(c.InstanceID)).CombinedOutput()
	assert.Error(t, err, "TAP device remains: %s", tap)
	assert.Empty(t, procsWithArgPrefix(dir+"/"), "processes remain")
	out, _ := exec.Command("ps", "-eo", "pid,args").Output()
	for _, l := range strings.Split(string(out), "\n") {
		assert.False(t, strings.Contains(l, "qemu-system") && strings.Contains(l, c.InstanceID.String()), "qemu remains: %s", l)
	}
	entries, _ := os.ReadDir(c.Root)
	for _, e := range entries {
		assert.False(t, strings.HasPrefix(e.Name(), stagingPrefix), "staging directory %s remains", e.Name())
	}
}

func testLog(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

// TestLaunchPing runs a launcher process that boots the test guest under QEMU TCG; the guest
// configures its network from the seed, fetches /v1/ping from the endpoint on the bridge and
// powers off. The launcher exits 0 and leaves nothing behind.
func TestLaunchPing(t *testing.T) {
	e := newVMEnv(t)
	c := e.config(t, "ping")
	c.ConsoleLog = filepath.Join(t.TempDir(), "console.log")
	start := time.Now()
	p := startLauncher(t, c)
	code := p.wait(t, 3*time.Minute)
	console, _ := os.ReadFile(c.ConsoleLog)
	require.Equal(t, 0, code, "launcher exit code; stderr:\n%s\nconsole:\n%s", p.stderr, console)
	select {
	case at := <-e.pings:
		t.Logf("launcher start to ping: %s", at.Sub(start).Round(time.Millisecond))
	default:
		assert.Fail(t, "the endpoint saw no ping")
	}
	for _, want := range []string{"seed on /dev/vd", "ping answer: pong from", "powering off"} {
		assert.Contains(t, string(console), want, "console log")
	}
	// Not NotContains: a failure would print the nonce.
	assert.False(t, bytes.Contains(p.stderr.Bytes(), []byte(c.Nonce.Reveal())), "the launcher logged the nonce")
	assertGone(t, c)
}

// TestPrepareRunClose drives the API in-process and checks the prepared instance: disk, seed,
// lease, TAP on the bridge; then boot-to-ping and a complete cleanup.
func TestPrepareRunClose(t *testing.T) {
	e := newVMEnv(t)
	c := e.config(t, "ping")
	ctx := context.Background()
	inst, err := Prepare(ctx, c, testLog(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = inst.Close() })
	dir := inst.Dir()
	for _, f := range []string{diskFile, seedFile, pidFile} {
		_, err := os.Stat(filepath.Join(dir, f))
		assert.NoError(t, err, f)
	}
	info, err := inspectImage(ctx, filepath.Join(dir, diskFile))
	if assert.NoError(t, err, "root disk") {
		assert.Equal(t, "qcow2", info.Format, "root disk %+v", info)
		assert.Equal(t, int64(1<<30), info.VirtualSize, "root disk %+v", info)
		assert.Empty(t, info.BackingFilename, "root disk %+v", info)
	}
	master, err := os.Readlink("/sys/class/net/" + inst.TAP() + "/master")
	if assert.NoError(t, err, "TAP %s master", inst.TAP()) {
		assert.Equal(t, e.bridge, filepath.Base(master), "TAP %s master", inst.TAP())
	}
	owner, ok := leaseOwner(filepath.Join(c.Root, leasesDir, inst.IP().String()))
	if assert.True(t, ok, "lease of %s", inst.IP()) {
		assert.Equal(t, c.InstanceID, owner, "lease of %s", inst.IP())
	}
	_, err = Prepare(ctx, c, testLog(t))
	assert.ErrorIs(t, err, ErrInstanceExists, "a second Prepare of the same instance")
	res, err := SweepCount(ctx, c.Root, testLog(t))
	if assert.NoError(t, err, "Sweep") {
		assert.Equal(t, SweepResult{}, res, "Sweep touched a live instance")
	}
	tm := inst.Timings()
	t.Logf("prepare: disk %s, seed %s, network %s, total %s", tm.Disk, tm.Seed, tm.Network, tm.Total)

	start := time.Now()
	err = inst.Run(ctx)
	ran := time.Since(start)
	serial, _ := os.ReadFile(inst.SerialLog())
	require.NoError(t, err, "Run; serial:\n%s", serial)
	assert.Contains(t, string(serial), "ping answer: pong", "serial log lacks the answer")
	select {
	case at := <-e.pings:
		t.Logf("boot to ping %s, boot to power-off %s", at.Sub(start).Round(time.Millisecond), ran.Round(time.Millisecond))
	default:
		assert.Fail(t, "the endpoint saw no ping")
	}
	require.NoError(t, inst.Close())
	assert.NoError(t, inst.Close(), "second Close")
	assertGone(t, c)
}

// TestLaunchSIGKILLThenSweep SIGKILLs a launcher mid-boot: its hypervisor dies with it
// (parent-death signal), and the next Sweep removes the TAP device, the files, the lease and
// the directory it left.
func TestLaunchSIGKILLThenSweep(t *testing.T) {
	e := newVMEnv(t)
	c := e.config(t, "hang")
	dir := filepath.Join(c.Root, c.InstanceID.String())
	p := startLauncher(t, c)
	waitBooting(t, dir)
	_, ok := tapAlias(TAPName(c.InstanceID))
	require.True(t, ok, "no TAP device while the hypervisor runs")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
	poll(t, 20*time.Second, "the hypervisor to die with its launcher", func() bool { return len(procsWithArgPrefix(dir+"/")) == 0 })
	// What a SIGKILLed launcher leaves behind, until the next sweep.
	_, err := os.Stat(filepath.Join(dir, diskFile))
	assert.NoError(t, err, "expected the dead instance's disk to remain before the sweep")
	_, ok = tapAlias(TAPName(c.InstanceID))
	assert.True(t, ok, "expected the dead instance's TAP device to remain before the sweep")
	res, err := SweepCount(context.Background(), c.Root, testLog(t))
	require.NoError(t, err)
	assert.Equal(t, 1, res.Instances, "Sweep removed %+v", res)
	assertGone(t, c)
}

// TestLaunchSIGTERM stops a launcher with SIGTERM, as the vm worker's Destroy does: exit code
// 4, the reason on stderr, nothing left.
func TestLaunchSIGTERM(t *testing.T) {
	e := newVMEnv(t)
	c := e.config(t, "hang")
	dir := filepath.Join(c.Root, c.InstanceID.String())
	p := startLauncher(t, c)
	waitBooting(t, dir)
	// The whole group, as the vm worker does it; the hypervisor is in a group of its own.
	require.NoError(t, syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM))
	assert.Equal(t, ExitStopped, p.wait(t, time.Minute), "exit code; stderr:\n%s", p.stderr)
	assert.Contains(t, p.stderr.String(), "\ndynrunner launcher: stopped", "stderr lacks the reason")
	assertGone(t, c)
}

// TestLaunchDeadline boots a guest that never powers off; the deadline kills it.
func TestLaunchDeadline(t *testing.T) {
	e := newVMEnv(t)
	c := e.config(t, "hang")
	c.Deadline = 15 * time.Second
	c.ConsoleLog = filepath.Join(t.TempDir(), "console.log")
	p := startLauncher(t, c)
	assert.Equal(t, ExitDeadline, p.wait(t, 2*time.Minute), "exit code; stderr:\n%s", p.stderr)
	assert.Contains(t, p.stderr.String(), "\ndynrunner launcher: the vm ran longer than --deadline 15s", "stderr lacks the reason")
	// Under a loaded TCG host the deadline may strike before the guest reaches its endless
	// loop; the kill is the same either way.
	if console, _ := os.ReadFile(c.ConsoleLog); !bytes.Contains(console, []byte("never powering off")) {
		t.Logf("the deadline struck before the guest reached its hang:\n%s", console)
	}
	assertGone(t, c)
}

// TestLaunchSIGTERMDuringPreparation stops a launcher while it prepares the instance (it may
// also have finished preparing by the time the signal lands; both end the same way).
func TestLaunchSIGTERMDuringPreparation(t *testing.T) {
	e := newVMEnv(t)
	c := e.config(t, "hang")
	dir := filepath.Join(c.Root, c.InstanceID.String())
	p := startLauncher(t, c)
	poll(t, time.Minute, "the instance directory", func() bool { _, err := os.Stat(dir); return err == nil })
	require.NoError(t, syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM))
	assert.Equal(t, ExitStopped, p.wait(t, time.Minute), "exit code; stderr:\n%s", p.stderr)
	assertGone(t, c)
}
