package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/launcher"
)

// vmImage builds the microVM guest image operators deploy (deploy/vm-image/build.sh: the
// Debian userland of the executor image; its cached parts built once) with this package's
// dynrunner binary, skipping (failing in CI) when the VM tools are missing. The directory
// holds rootfs.qcow2, vmlinuz, initrd.img and cmdline.
func vmImage(t testing.TB) (dir string) {
	t.Helper()
	return buildImage(t, "../deploy/vm-image/build.sh")
}

// buildImage runs an image script with this package's dynrunner binary, and the variables env
// (NAME=value), into a new directory.
func buildImage(t testing.TB, script string, env ...string) (dir string) {
	t.Helper()
	needVMTools(t)
	dir = t.TempDir()
	cmd := exec.Command("bash", script, dir)
	cmd.Env = append(append(os.Environ(), "DYNRUNNER_BIN="+dynrunnerBin(t)), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s:\n%s", script, out)
	return dir
}

// vmEnv is the controller's settings for the guest image in img, on bridge with cidr.
func vmEnv(t testing.TB, img, bridge, cidr string, extra ...string) []string {
	t.Helper()
	cmdline, err := os.ReadFile(filepath.Join(img, "cmdline"))
	require.NoError(t, err)
	t.Cleanup(func() {
		// The controller keeps the guests' firewall while launchers may run; the test removes it
		// with the bridge.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, launcher.RemoveFirewall(ctx, bridge), "remove the guests' firewall of %s", bridge)
		_ = exec.Command("ip", "link", "del", bridge).Run()
	})
	return append([]string{
		"VM_IMAGE=" + filepath.Join(img, "rootfs.qcow2"),
		"VM_KERNEL=" + filepath.Join(img, "vmlinuz"),
		"VM_INITRAMFS=" + filepath.Join(img, "initrd.img"),
		"VM_CMDLINE=" + strings.TrimSpace(string(cmdline)),
		"VM_HYPERVISOR=qemu", "VM_MEMORY_MIB=1024", "VM_CPUS=1", "VM_DISK_GIB=2",
		"VM_BRIDGE=" + bridge, "VM_BRIDGE_CIDR=" + cidr,
		"VM_LAUNCHER_ROOT=" + filepath.Join(t.TempDir(), "vms"),
	}, extra...)
}

// busyboxImage builds (cached) the launcher's minimal test guest (scripts/vm-test-image.sh: a
// busybox initramfs, no userland), for the boot-time baseline.
func busyboxImage(t testing.TB) (dir string) {
	t.Helper()
	return buildImage(t, "../scripts/vm-test-image.sh")
}

// needVMTools skips (fails in CI) the test without the VM tier's tools or root.
func needVMTools(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "genisoimage", "busybox", "cpio", "mkfs.ext4", "debootstrap", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "" {
				t.Skipf("%s is missing; install the VM test tier's tools with: bash scripts/vm-deps.sh", tool)
			}
			require.NoError(t, err, "%s is missing although CI must provide it (scripts/vm-deps.sh)", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("the VM tier needs root for the bridge and TAP devices")
	}
}

func TestVMJobBootsUnderQEMU(t *testing.T) {
	tools := needTools(t)
	img := vmImage(t)
	f := startForge(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "vm")
	require.NoError(t, err)
	require.NoError(t, f.SetSecret(ctx, repo, "E2E_SECRET", secretValue))
	const bridge = "dre2e0"
	env := vmEnv(t, img, bridge, "10.213.77.1/24", "VM_CONCURRENCY=2")
	c := newController(t, tools, f, repo.String(), append([]string{leaseEnv, pickupEnv}, env...)...)
	var launchers string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "VM_LAUNCHER_ROOT="); ok {
			launchers = v
		}
	}
	c.start()

	res := runWorkflow(t, f, repo, `name: vm
on: [push]
jobs:
  inside:
    runs-on: [self-hosted, vm]
    steps:
      - shell: sh
        run: |
          echo "kernel $(uname -r)"
          grep -m1 'model name' /proc/cpuinfo
          echo "vm job done"
  both:
    runs-on: [self-hosted, pod, vm]
    steps:
      - run: echo should never run
`, 10*time.Minute)
	inside := res["inside"]
	require.Equal(t, "success", inside.conclusion, "vm job:\n%s", inside.log)
	require.Contains(t, inside.log, "vm job done", "vm job log")
	require.Contains(t, inside.log, "QEMU", "vm job log")
	both := res["both"]
	require.Equal(t, "failure", both.conclusion, "pod+vm job:\n%s", both.log)
	require.Contains(t, both.log, "both pod and vm", "pod+vm job log")

	// The core end-to-end workflow, every job in a microVM of its own.
	began := time.Now()
	got := runWorkflow(t, f, repo, strings.ReplaceAll(workflow, "[self-hosted, pod]", "[self-hosted, vm]"), 15*time.Minute)
	t.Logf("the core workflow's %d jobs ran in microVMs in %s", len(got), time.Since(began).Round(time.Second))
	require.Len(t, got, 8, "ran jobs %v, want the core workflow's 8", keys(got))
	checkCoreWorkflow(t, got)

	// Nothing of the VM remains: no launcher, no qemu, no TAP device, no per-VM directory.
	deadline := time.Now().Add(time.Minute)
	for {
		left := vmLeftovers(launchers, bridge)
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "left behind after the VM job: %s", left)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// vmLeftovers describes what of a microVM whose launcher root is root, on bridge, still
// exists, or "".
func vmLeftovers(root, bridge string) string {
	var left []string
	if out, _ := exec.Command("pgrep", "-f", "qemu-system-x86_64.*"+root).Output(); len(strings.TrimSpace(string(out))) > 0 {
		left = append(left, "qemu processes "+strings.Join(strings.Fields(string(out)), ","))
	}
	if out, _ := exec.Command("ip", "-o", "link", "show", "master", bridge).Output(); len(strings.TrimSpace(string(out))) > 0 {
		left = append(left, "devices on the bridge: "+strings.TrimSpace(string(out)))
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			left = append(left, fmt.Sprintf("directory %s", filepath.Join(root, e.Name())))
		}
	}
	return strings.Join(left, "; ")
}

// BenchmarkVMBootToRegistered measures, for a [self-hosted, vm] job, the time from the
// environment's start (the launcher process exists) to the guest's registration at the facade
// (booted under QEMU TCG, nonce redeemed, runner fetched and checked), from the assignment's
// own records, and the whole push-to-success time; for the Debian guest image operators deploy
// (deploy/vm-image/build.sh) and, as the baseline, the launcher's busybox test guest.
func BenchmarkVMBootToRegistered(b *testing.B) {
	tools := needTools(b)
	b.Run("debian", func(b *testing.B) {
		img := vmImage(b)
		benchVMBoot(b, tools, vmEnv(b, img, "drbench0", "10.213.78.1/24"))
	})
	b.Run("busybox", func(b *testing.B) {
		img := busyboxImage(b)
		cmdline, err := os.ReadFile(filepath.Join(img, "cmdline"))
		require.NoError(b, err)
		b.Cleanup(func() { _ = exec.Command("ip", "link", "del", "drbench1").Run() })
		benchVMBoot(b, tools, []string{
			"VM_IMAGE=" + filepath.Join(img, "base.qcow2"), "VM_KERNEL=" + filepath.Join(img, "vmlinuz"),
			"VM_INITRAMFS=" + filepath.Join(img, "initramfs.cpio.gz"), "VM_CMDLINE=" + strings.TrimSpace(string(cmdline)),
			"VM_HYPERVISOR=qemu", "VM_MEMORY_MIB=1024", "VM_CPUS=1", "VM_DISK_GIB=1",
			"VM_BRIDGE=drbench1", "VM_BRIDGE_CIDR=10.213.80.1/24", "VM_LAUNCHER_ROOT=" + filepath.Join(b.TempDir(), "vms"),
		})
	})
}

func benchVMBoot(b *testing.B, tools devforge.Tools, vm []string) {
	f := startForge(b, tools)
	repo, err := f.CreateRepo(b.Context(), "vmbench")
	require.NoError(b, err)
	c := newController(b, tools, f, repo.String(), append([]string{leaseEnv, pickupEnv}, vm...)...)
	c.start()
	var boot, total time.Duration
	for i := range b.N {
		start := time.Now()
		res := runWorkflow(b, f, repo, fmt.Sprintf("name: vm%d\non: [push]\njobs:\n  inside:\n    runs-on: [self-hosted, vm]\n    steps:\n      - shell: sh\n        run: echo run %d\n", i, i), 10*time.Minute)
		total += time.Since(start)
		require.Equal(b, "success", res["inside"].conclusion, "vm job:\n%s", res["inside"].log)
	}
	// Read started → registered of every assignment from the audit stream.
	cmd := exec.Command(controllerBin(b), "events", "--json", "--follow=false")
	cmd.Env = c.env
	out, err := cmd.Output()
	require.NoError(b, err, "dynrunner events")
	startedAt := map[int64]time.Time{}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r struct {
			Task       int64     `json:"task_id"`
			Transition string    `json:"transition"`
			At         time.Time `json:"at"`
		}
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		switch r.Transition {
		case "started":
			startedAt[r.Task] = r.At
		case "registered":
			if s, ok := startedAt[r.Task]; ok {
				boot += r.At.Sub(s)
				n++
			}
		}
	}
	require.Equal(b, b.N, n, "started→registered pairs")
	b.ReportMetric(boot.Seconds()/float64(n), "boot-to-registered-s")
	b.ReportMetric(total.Seconds()/float64(b.N), "push-to-success-s")
}
