package main

import (
	"fmt"
	"maps"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/launcher"
)

// TestLaunchEnv: every launcher gets the DYNRUNNER_LAUNCH_* values it got when the controller
// wrote them out by hand; an empty one, which the launcher takes as unset, is left out.
func TestLaunchEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		vm   config.VM
	}{
		{"direct kernel boot, name servers", config.VM{
			Image: "/srv/vm/base.qcow2", Kernel: "/srv/vm/vmlinuz", Initramfs: "/srv/vm/initrd", Cmdline: "console=ttyS0",
			Hypervisor: "qemu", CPUs: 3, MemoryMiB: 1024, DiskGiB: 8, Bridge: "dynrunner0",
			BridgeCIDR: netip.MustParsePrefix("10.213.0.1/24"), DNS: []netip.Addr{netip.MustParseAddr("10.213.0.1"), netip.MustParseAddr("9.9.9.9")},
			LauncherRoot: "/var/lib/dynrunner/vms",
		}},
		{"firmware, no name servers", config.VM{
			Image: "/srv/vm/base.raw", Firmware: "/srv/vm/hypervisor-fw", Hypervisor: "cloud-hypervisor", CPUs: 2, MemoryMiB: 2048, DiskGiB: 20,
			Bridge: "br1", BridgeCIDR: netip.MustParsePrefix("10.9.0.1/16"), LauncherRoot: "/srv/vms",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Controller{VM: tc.vm}
			handWritten := map[string]string{
				"DYNRUNNER_LAUNCH_IMAGE":       cfg.VM.Image,
				"DYNRUNNER_LAUNCH_KERNEL":      cfg.VM.Kernel,
				"DYNRUNNER_LAUNCH_INITRAMFS":   cfg.VM.Initramfs,
				"DYNRUNNER_LAUNCH_CMDLINE":     cfg.VM.Cmdline,
				"DYNRUNNER_LAUNCH_FIRMWARE":    cfg.VM.Firmware,
				"DYNRUNNER_LAUNCH_HYPERVISOR":  cfg.VM.Hypervisor,
				"DYNRUNNER_LAUNCH_CPUS":        fmt.Sprint(cfg.VM.CPUs),
				"DYNRUNNER_LAUNCH_MEMORY_MIB":  fmt.Sprint(cfg.VM.MemoryMiB),
				"DYNRUNNER_LAUNCH_DISK_GIB":    fmt.Sprint(cfg.VM.DiskGiB),
				"DYNRUNNER_LAUNCH_BRIDGE":      cfg.VM.Bridge,
				"DYNRUNNER_LAUNCH_BRIDGE_CIDR": cfg.VM.BridgeCIDR.String(),
				"DYNRUNNER_LAUNCH_DNS":         launcher.JoinAddrs(cfg.VM.DNS),
				"DYNRUNNER_LAUNCH_ROOT":        cfg.VM.LauncherRoot,
				"DYNRUNNER_LAUNCH_DEADLINE":    "6h",
			}
			maps.DeleteFunc(handWritten, func(_, v string) bool { return v == "" })
			env := launchEnv(cfg)
			require.Equal(t, handWritten, env)

		})
	}
}
