package launcher

import (
	"errors"
	"fmt"
	"net"
	"strconv"
)

// VMSpec is what a Hypervisor needs to build its command line. Every path is absolute and was
// validated by Config.Validate or created by Prepare inside the instance directory.
type VMSpec struct {
	Dir       string // the instance directory
	Disk      string // the qcow2 root disk
	Seed      string // the NoCloud seed ISO (attached read-only)
	Serial    string // file receiving the serial console
	APISocket string // Cloud Hypervisor's API socket
	TAP       string // the TAP device, already attached to the bridge
	MAC       net.HardwareAddr
	CPUs      int
	MemoryMiB int
	Kernel    string // direct kernel boot when set
	Initramfs string
	Cmdline   string
	Firmware  string
}

// Hypervisor builds the command line of one VM. The launcher runs argv with exec (never a
// shell), resolving argv[0] through PATH.
type Hypervisor interface {
	// Name is the value of --hypervisor.
	Name() string
	// Command returns the argv that runs the VM of spec in the foreground until the guest
	// powers off.
	Command(spec VMSpec) ([]string, error)
}

var (
	_ Hypervisor = CloudHypervisor{}
	_ Hypervisor = QEMU{}
)

// NewHypervisor returns the Hypervisor called name (HypervisorCloudHypervisor or
// HypervisorQEMU).
func NewHypervisor(name string) (Hypervisor, error) {
	switch name {
	case HypervisorCloudHypervisor:
		return CloudHypervisor{}, nil
	case HypervisorQEMU:
		return QEMU{}, nil
	}
	return nil, invalidf("--hypervisor %q: want %s or %s", clip(name), HypervisorCloudHypervisor, HypervisorQEMU)
}

// CloudHypervisor runs the VM with Cloud Hypervisor, the production hypervisor. Guest memory is
// always shared=on: inside LXC the default private memfd mapping is charged twice to the
// container's cgroup (shmem and anonymous copy-on-write) once the guest writes to it.
type CloudHypervisor struct {
	// Binary is argv[0]; empty means "cloud-hypervisor".
	Binary string
}

// Name implements Hypervisor.
func (CloudHypervisor) Name() string { return HypervisorCloudHypervisor }

// Command implements Hypervisor.
func (h CloudHypervisor) Command(s VMSpec) ([]string, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if s.APISocket == "" {
		return nil, errors.New("launcher: cloud-hypervisor: no API socket path")
	}
	bin := h.Binary
	if bin == "" {
		bin = "cloud-hypervisor"
	}
	argv := []string{bin,
		"--api-socket", s.APISocket,
		"--cpus", "boot=" + strconv.Itoa(s.CPUs),
		"--memory", "size=" + strconv.Itoa(s.MemoryMiB) + "M,shared=on",
	}
	switch {
	case s.Kernel != "":
		argv = append(argv, "--kernel", s.Kernel)
		if s.Initramfs != "" {
			argv = append(argv, "--initramfs", s.Initramfs)
		}
		if s.Cmdline != "" {
			argv = append(argv, "--cmdline", s.Cmdline)
		}
	case s.Firmware != "":
		argv = append(argv, "--firmware", s.Firmware)
	default:
		return nil, errors.New("launcher: cloud-hypervisor needs a kernel or a firmware")
	}
	return append(argv,
		"--disk", "path="+s.Disk, "path="+s.Seed+",readonly=on",
		"--net", "tap="+s.TAP+",mac="+s.MAC.String(),
		"--serial", "file="+s.Serial,
		"--console", "off",
	), nil
}

// QEMU runs the VM with QEMU under TCG (software emulation) on the pc machine, where Cloud
// Hypervisor cannot run. TCG works without /dev/kvm and inside nested environments where
// hardware guests hang; -M microvm hangs under TCG. -no-reboot turns a guest reboot into an exit.
type QEMU struct {
	// Binary is argv[0]; empty means "qemu-system-x86_64".
	Binary string
}

// Name implements Hypervisor.
func (QEMU) Name() string { return HypervisorQEMU }

// Command implements Hypervisor.
func (h QEMU) Command(s VMSpec) ([]string, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	bin := h.Binary
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	argv := []string{bin,
		"-accel", "tcg",
		"-M", "pc",
		"-nographic", "-nodefaults", "-no-user-config",
		"-serial", "file:" + s.Serial,
		"-m", strconv.Itoa(s.MemoryMiB),
		"-smp", strconv.Itoa(s.CPUs),
	}
	if s.Kernel != "" {
		argv = append(argv, "-kernel", s.Kernel)
		if s.Initramfs != "" {
			argv = append(argv, "-initrd", s.Initramfs)
		}
		if s.Cmdline != "" {
			argv = append(argv, "-append", s.Cmdline)
		}
	} else if s.Firmware != "" {
		argv = append(argv, "-bios", s.Firmware)
	}
	// cache=none opens the disk with O_DIRECT, which Prepare has probed.
	return append(argv,
		"-drive", "file="+s.Disk+",if=virtio,format=qcow2,cache=none",
		"-drive", "file="+s.Seed+",if=virtio,format=raw,readonly=on",
		"-netdev", "tap,id=n0,ifname="+s.TAP+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+s.MAC.String(),
		"-no-reboot",
	), nil
}

// check refuses a spec whose values would break the option strings (which have no quoting).
func (s VMSpec) check() error {
	for _, p := range []struct{ name, v string }{
		{"disk", s.Disk}, {"seed", s.Seed}, {"serial", s.Serial}, {"api socket", s.APISocket},
		{"kernel", s.Kernel}, {"initramfs", s.Initramfs}, {"firmware", s.Firmware},
	} {
		if p.v == "" && (p.name == "kernel" || p.name == "initramfs" || p.name == "firmware" || p.name == "api socket") {
			continue
		}
		if err := checkPath(p.name, p.v); err != nil {
			return fmt.Errorf("launcher: vm spec: %w", err)
		}
	}
	if err := checkIfName("tap", s.TAP); err != nil {
		return fmt.Errorf("launcher: vm spec: %w", err)
	}
	if len(s.MAC) != 6 {
		return fmt.Errorf("launcher: vm spec: MAC %q: %w", s.MAC, ErrInvalidConfig)
	}
	if s.CPUs < 1 || s.MemoryMiB < 1 {
		return fmt.Errorf("launcher: vm spec: %d cpus, %d MiB: %w", s.CPUs, s.MemoryMiB, ErrInvalidConfig)
	}
	if err := checkCmdline(s.Cmdline); err != nil {
		return fmt.Errorf("launcher: vm spec: %w", err)
	}
	return nil
}
