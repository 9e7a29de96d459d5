package launcher

import (
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testSpec() VMSpec {
	return VMSpec{
		Dir:       "/r/0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
		Disk:      "/r/0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b/disk.qcow2",
		Seed:      "/r/0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b/seed.iso",
		Serial:    "/r/0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b/serial.log",
		APISocket: "/r/0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b/ch.sock",
		TAP:       "dr0b5e7d3a",
		MAC:       net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55},
		CPUs:      2,
		MemoryMiB: 2048,
	}
}

func TestHypervisorCommand(t *testing.T) {
	const d = "/r/0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	withKernel := func(s VMSpec) VMSpec {
		s.Kernel, s.Initramfs, s.Cmdline = "/img/vmlinuz", "/img/initrd", "console=ttyS0 quiet"
		return s
	}
	tests := []struct {
		name string
		hv   Hypervisor
		spec VMSpec
		want string // argv joined with single spaces
	}{
		{
			name: "cloud-hypervisor direct kernel boot",
			hv:   CloudHypervisor{},
			spec: withKernel(testSpec()),
			want: "cloud-hypervisor --api-socket " + d + "/ch.sock --cpus boot=2 --memory size=2048M,shared=on" +
				" --kernel /img/vmlinuz --initramfs /img/initrd --cmdline|console=ttyS0 quiet|" +
				" --disk path=" + d + "/disk.qcow2 path=" + d + "/seed.iso,readonly=on" +
				" --net tap=dr0b5e7d3a,mac=02:11:22:33:44:55 --serial file=" + d + "/serial.log --console off",
		},
		{
			name: "cloud-hypervisor firmware",
			hv:   CloudHypervisor{Binary: "/opt/ch/cloud-hypervisor"},
			spec: func() VMSpec {
				s := testSpec()
				s.Firmware = "/fw/hypervisor-fw"
				s.CPUs = 4
				s.MemoryMiB = 8192
				return s
			}(),
			want: "/opt/ch/cloud-hypervisor --api-socket " + d + "/ch.sock --cpus boot=4 --memory size=8192M,shared=on" +
				" --firmware /fw/hypervisor-fw" +
				" --disk path=" + d + "/disk.qcow2 path=" + d + "/seed.iso,readonly=on" +
				" --net tap=dr0b5e7d3a,mac=02:11:22:33:44:55 --serial file=" + d + "/serial.log --console off",
		},
		{
			name: "qemu direct kernel boot",
			hv:   QEMU{},
			spec: withKernel(testSpec()),
			want: "qemu-system-x86_64 -accel tcg -M pc -nographic -nodefaults -no-user-config -serial file:" + d + "/serial.log" +
				" -m 2048 -smp 2 -kernel /img/vmlinuz -initrd /img/initrd -append|console=ttyS0 quiet|" +
				" -drive file=" + d + "/disk.qcow2,if=virtio,format=qcow2,cache=none" +
				" -drive file=" + d + "/seed.iso,if=virtio,format=raw,readonly=on" +
				" -netdev tap,id=n0,ifname=dr0b5e7d3a,script=no,downscript=no" +
				" -device virtio-net-pci,netdev=n0,mac=02:11:22:33:44:55 -no-reboot",
		},
		{
			name: "qemu boots the disk",
			hv:   QEMU{},
			spec: func() VMSpec { s := testSpec(); s.CPUs = 1; s.MemoryMiB = 256; return s }(),
			want: "qemu-system-x86_64 -accel tcg -M pc -nographic -nodefaults -no-user-config -serial file:" + d + "/serial.log" +
				" -m 256 -smp 1" +
				" -drive file=" + d + "/disk.qcow2,if=virtio,format=qcow2,cache=none" +
				" -drive file=" + d + "/seed.iso,if=virtio,format=raw,readonly=on" +
				" -netdev tap,id=n0,ifname=dr0b5e7d3a,script=no,downscript=no" +
				" -device virtio-net-pci,netdev=n0,mac=02:11:22:33:44:55 -no-reboot",
		},
		{
			name: "qemu firmware",
			hv:   QEMU{Binary: "/usr/bin/qemu-system-x86_64"},
			spec: func() VMSpec { s := testSpec(); s.Firmware = "/usr/share/ovmf/OVMF.fd"; return s }(),
			want: "/usr/bin/qemu-system-x86_64 -accel tcg -M pc -nographic -nodefaults -no-user-config -serial file:" + d + "/serial.log" +
				" -m 2048 -smp 2 -bios /usr/share/ovmf/OVMF.fd" +
				" -drive file=" + d + "/disk.qcow2,if=virtio,format=qcow2,cache=none" +
				" -drive file=" + d + "/seed.iso,if=virtio,format=raw,readonly=on" +
				" -netdev tap,id=n0,ifname=dr0b5e7d3a,script=no,downscript=no" +
				" -device virtio-net-pci,netdev=n0,mac=02:11:22:33:44:55 -no-reboot",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv, err := tt.hv.Command(tt.spec)
			require.NoError(t, err)
			assert.Equal(t, tt.want, joinArgv(argv))
		})
	}
}

// joinArgv joins argv with spaces, marking an argument that itself holds a space with |...|.
func joinArgv(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if strings.Contains(a, " ") {
			b.WriteString("|" + a + "|")
		} else {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(a)
		}
	}
	return b.String()
}

func TestHypervisorCommandRefuses(t *testing.T) {
	tests := []struct {
		name   string
		hv     Hypervisor
		modify func(*VMSpec)
	}{
		{name: "ch without kernel or firmware", hv: CloudHypervisor{}, modify: func(*VMSpec) {}},
		{name: "ch without api socket", hv: CloudHypervisor{}, modify: func(s *VMSpec) { s.Kernel = "/k"; s.APISocket = "" }},
		{name: "comma in disk path", hv: QEMU{}, modify: func(s *VMSpec) { s.Disk = "/r/a,format=raw" }},
		{name: "relative seed", hv: QEMU{}, modify: func(s *VMSpec) { s.Seed = "seed.iso" }},
		{name: "tap too long", hv: QEMU{}, modify: func(s *VMSpec) { s.TAP = "dr0123456789abcdef" }},
		{name: "tap with comma", hv: QEMU{}, modify: func(s *VMSpec) { s.TAP = "a,script=/x" }},
		{name: "no mac", hv: QEMU{}, modify: func(s *VMSpec) { s.MAC = nil }},
		{name: "cmdline newline", hv: QEMU{}, modify: func(s *VMSpec) { s.Kernel = "/k"; s.Cmdline = "a\nb" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSpec()
			tt.modify(&s)
			argv, err := tt.hv.Command(s)
			assert.Error(t, err, "Command = %q", argv)
		})
	}
}

func TestNewHypervisor(t *testing.T) {
	for _, name := range []string{HypervisorCloudHypervisor, HypervisorQEMU} {
		hv, err := NewHypervisor(name)
		require.NoError(t, err)
		assert.Equal(t, name, hv.Name())
	}
	_, err := NewHypervisor("kvmtool")
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

func TestCloudHypervisorSharedMemory(t *testing.T) {
	// Inside LXC the guest memory must be shared=on, whatever else changes.
	s := testSpec()
	s.Kernel = "/k"
	argv, err := CloudHypervisor{}.Command(s)
	require.NoError(t, err)
	i := slices.Index(argv, "--memory")
	require.GreaterOrEqual(t, i, 0, "argv %q lacks --memory", argv)
	assert.True(t, strings.HasSuffix(argv[i+1], ",shared=on"), "argv %q lacks --memory ...,shared=on", argv)
}
