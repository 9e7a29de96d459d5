package main

import (
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/launcher"
)

// TestLaunchEnv: the launcher settings the controller writes (launchEnv), with the instance,
// nonce and endpoint the vm worker adds, are what `dynrunner launcher` reads back.
func TestLaunchEnv(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, nil, 0o600))
		return p
	}
	for _, tc := range []struct {
		name string
		vm   config.VM
	}{
		{"direct kernel boot, name servers", config.VM{
			Image: path("base.qcow2"), Kernel: path("vmlinuz"), Initramfs: path("initrd"), Cmdline: "console=ttyS0",
			Hypervisor: "qemu", CPUs: 3, MemoryMiB: 1024, DiskGiB: 8, Bridge: "dynrunner0",
			BridgeCIDR: netip.MustParsePrefix("10.213.0.1/24"), DNS: []netip.Addr{netip.MustParseAddr("10.213.0.1"), netip.MustParseAddr("9.9.9.9")},
			LauncherRoot: "/var/lib/dynrunner/vms",
		}},
		{"firmware, no name servers", config.VM{
			Image: path("base.raw"), Firmware: path("hypervisor-fw"), Hypervisor: "cloud-hypervisor", CPUs: 2, MemoryMiB: 2048, DiskGiB: 20,
			Bridge: "br1", BridgeCIDR: netip.MustParsePrefix("10.9.0.1/16"), LauncherRoot: "/srv/vms",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := launchEnv(config.Controller{VM: tc.vm})
			instance, nonce := "3f1c1b7e-2a4b-4c1d-9e8f-0a1b2c3d4e5f", "nonce-0123456789abcdef"
			endpoint := "http://" + tc.vm.BridgeCIDR.Addr().String() + ":7001"
			env[launcher.EnvInstanceID], env[launcher.EnvNonce], env[launcher.EnvEndpoint] = instance, nonce, endpoint
			s, err := parseLauncher(nil, func(k string) string { return env[k] }, io.Discard)
			require.NoError(t, err)
			got := s.vm
			assert.Equal(t, instance, got.InstanceID.String())
			assert.Equal(t, nonce, got.Nonce.Reveal())
			assert.Equal(t, endpoint, got.Endpoint.String())
			assert.Equal(t, tc.vm.Image, got.Image)
			assert.Equal(t, tc.vm.Kernel, got.Kernel)
			assert.Equal(t, tc.vm.Initramfs, got.Initramfs)
			assert.Equal(t, tc.vm.Cmdline, got.Cmdline)
			assert.Equal(t, tc.vm.Firmware, got.Firmware)
			assert.Equal(t, tc.vm.Hypervisor, got.Hypervisor)
			assert.Equal(t, tc.vm.CPUs, got.CPUs)
			assert.Equal(t, tc.vm.MemoryMiB, got.MemoryMiB)
			assert.Equal(t, tc.vm.DiskGiB, got.DiskGiB)
			assert.Equal(t, tc.vm.Bridge, got.Bridge)
			assert.Equal(t, tc.vm.BridgeCIDR, got.BridgeCIDR)
			assert.Equal(t, tc.vm.DNS, got.DNS)
			assert.Equal(t, tc.vm.LauncherRoot, got.Root)
			assert.Equal(t, launcher.DefaultDeadline, got.Deadline)
		})
	}
}
