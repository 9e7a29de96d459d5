package launcher

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Hypervisor names for Config.Hypervisor.
const (
	HypervisorCloudHypervisor = "cloud-hypervisor"
	HypervisorQEMU            = "qemu"
)

// Config describes one VM. Build it with DefaultConfig (or ParseFlags) and fill in the
// per-instance fields; Validate checks everything that comes from outside.
type Config struct {
	InstanceID InstanceID
	Nonce      Nonce
	Endpoint   Endpoint // the nonce endpoint; its address must lie inside BridgeCIDR

	Image     string // base image, qcow2 or raw: an absolute path of a regular file
	Kernel    string // optional direct kernel boot (the test tier)
	Initramfs string // optional, needs Kernel
	Cmdline   string // optional, needs Kernel
	Firmware  string // firmware for booting the disk (Cloud Hypervisor: required without Kernel)

	CPUs      int
	MemoryMiB int
	DiskGiB   int // virtual size of the instance's qcow2 disk

	Bridge     string       // the bridge the TAP device joins
	BridgeCIDR netip.Prefix // the bridge's own address and the guests' network
	DNS        []netip.Addr // name servers the guest resolves with (network-config), optional

	Hypervisor string        // HypervisorCloudHypervisor or HypervisorQEMU
	Deadline   time.Duration // the VM is killed when it runs longer
	Root       string        // parent of the instance directories

	// ConsoleLog, when set, is where the guest's serial console log is copied when the
	// instance is cleaned up (the instance directory itself is removed).
	ConsoleLog string
}

// Defaults.
const (
	DefaultCPUs       = 2
	DefaultMemoryMiB  = 2048
	DefaultDiskGiB    = 20
	DefaultBridge     = "dynrunner0"
	DefaultBridgeCIDR = "10.213.0.1/24"
	DefaultHypervisor = HypervisorCloudHypervisor
	DefaultDeadline   = 6 * time.Hour
	DefaultRoot       = "/var/lib/dynrunner/launcher"
)

// Bounds checked by Validate.
const (
	maxCPUs       = 256
	minMemoryMiB  = 128
	maxMemoryMiB  = 1 << 20
	maxDiskGiB    = 16 << 10
	maxCmdlineLen = 4096
	maxPathLen    = 1024
	// maxRootLen keeps <root>/<instance-id>/ch.sock within the 107 bytes of a unix socket path.
	maxRootLen = 107 - len("/00000000-0000-0000-0000-000000000000/"+apiSocketFile)
)

// DefaultConfig returns a Config with every default set and no instance.
func DefaultConfig() Config {
	return Config{
		CPUs:       DefaultCPUs,
		MemoryMiB:  DefaultMemoryMiB,
		DiskGiB:    DefaultDiskGiB,
		Bridge:     DefaultBridge,
		BridgeCIDR: netip.MustParsePrefix(DefaultBridgeCIDR),
		Hypervisor: DefaultHypervisor,
		Deadline:   DefaultDeadline,
		Root:       DefaultRoot,
	}
}

// Validate checks c. Every error wraps ErrInvalidConfig. It stats the files Image, Kernel,
// Initramfs and Firmware, which must be regular files.
func (c Config) Validate() error {
	if c.InstanceID.IsZero() {
		return invalidf("--instance-id is required")
	}
	if c.Nonce.IsZero() {
		return invalidf("--nonce is required")
	}
	if c.Endpoint.IsZero() {
		return invalidf("--endpoint is required")
	}
	if err := checkFile("--image", c.Image, true); err != nil {
		return err
	}
	for _, f := range []struct{ name, path string }{
		{"--kernel", c.Kernel}, {"--initramfs", c.Initramfs}, {"--firmware", c.Firmware},
	} {
		if err := checkFile(f.name, f.path, false); err != nil {
			return err
		}
	}
	if c.Kernel == "" && (c.Initramfs != "" || c.Cmdline != "") {
		return invalidf("--initramfs and --cmdline need --kernel")
	}
	if c.Kernel != "" && c.Firmware != "" {
		return invalidf("--kernel and --firmware exclude each other")
	}
	if err := checkCmdline(c.Cmdline); err != nil {
		return err
	}
	switch {
	case c.CPUs < 1 || c.CPUs > maxCPUs:
		return invalidf("--cpus %d: want 1 to %d", c.CPUs, maxCPUs)
	case c.MemoryMiB < minMemoryMiB || c.MemoryMiB > maxMemoryMiB:
		return invalidf("--memory-mib %d: want %d to %d", c.MemoryMiB, minMemoryMiB, maxMemoryMiB)
	case c.DiskGiB < 1 || c.DiskGiB > maxDiskGiB:
		return invalidf("--disk-gib %d: want 1 to %d", c.DiskGiB, maxDiskGiB)
	case c.Deadline <= 0:
		return invalidf("--deadline %s: want a positive duration", c.Deadline)
	}
	if err := checkIfName("--bridge", c.Bridge); err != nil {
		return err
	}
	if err := checkBridgeCIDR(c.BridgeCIDR); err != nil {
		return err
	}
	if ip := c.Endpoint.Addr.Addr(); !c.BridgeCIDR.Contains(ip) || ip == c.BridgeCIDR.Masked().Addr() || ip == broadcast(c.BridgeCIDR) {
		return invalidf("--endpoint %s: the nonce endpoint must listen on the bridge network %s", c.Endpoint, c.BridgeCIDR)
	}
	switch c.Hypervisor {
	case HypervisorCloudHypervisor:
		if c.Kernel == "" && c.Firmware == "" {
			return invalidf("cloud-hypervisor needs --kernel or --firmware")
		}
	case HypervisorQEMU:
	default:
		return invalidf("--hypervisor %q: want %s or %s", clip(c.Hypervisor), HypervisorCloudHypervisor, HypervisorQEMU)
	}
	if err := checkPath("--root", c.Root); err != nil {
		return err
	}
	if len(c.Root) > maxRootLen {
		return invalidf("--root %q: longer than %d bytes (the API socket path would not fit)", c.Root, maxRootLen)
	}
	if c.ConsoleLog != "" {
		if err := checkPath("--console-log", c.ConsoleLog); err != nil {
			return err
		}
		if within(c.ConsoleLog, c.Root) {
			return invalidf("--console-log %q: must not be below --root", c.ConsoleLog)
		}
	}
	return nil
}

// checkPath accepts an absolute, clean path of the characters [A-Za-z0-9._/+@-] without "..".
// The character set keeps every path safe inside the comma- and colon-separated option strings
// of the hypervisors (which have no quoting) and refuses every shell metacharacter.
func checkPath(flag, p string) error {
	if p == "" {
		return invalidf("%s is required", flag)
	}
	if len(p) > maxPathLen {
		return invalidf("%s: path longer than %d bytes", flag, maxPathLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !alnum(c) && strings.IndexByte("._/+@-", c) < 0 {
			return invalidf("%s %q: character %q not allowed (want [A-Za-z0-9._/+@-])", flag, clip(p), c)
		}
	}
	if !filepath.IsAbs(p) {
		return invalidf("%s %q: want an absolute path", flag, clip(p))
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return invalidf("%s %q: \"..\" is not allowed", flag, clip(p))
		}
	}
	if filepath.Clean(p) != p {
		return invalidf("%s %q: want a clean path (%q)", flag, clip(p), filepath.Clean(p))
	}
	return nil
}

// checkFile checks p with checkPath and that it names a regular file (symbolic links are
// followed). An empty p is an error only when required.
func checkFile(flag, p string, required bool) error {
	if p == "" && !required {
		return nil
	}
	if err := checkPath(flag, p); err != nil {
		return err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return invalidf("%s: %v", flag, err)
	}
	if !fi.Mode().IsRegular() {
		return invalidf("%s %q: not a regular file", flag, p)
	}
	return nil
}

// checkCmdline accepts printable ASCII only.
func checkCmdline(s string) error {
	if len(s) > maxCmdlineLen {
		return invalidf("--cmdline: longer than %d bytes", maxCmdlineLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return invalidf("--cmdline: byte %d (%#x) is not printable ASCII", i+1, s[i])
		}
	}
	return nil
}

// checkIfName accepts a Linux interface name: 1-15 characters of [A-Za-z0-9_.-], not "." or "..".
func checkIfName(flag, s string) error {
	if s == "" || len(s) > 15 || s == "." || s == ".." {
		return invalidf("%s %q: want 1 to 15 characters", flag, clip(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !alnum(c) && c != '_' && c != '.' && c != '-' {
			return invalidf("%s %q: character %q not allowed (want [A-Za-z0-9_.-])", flag, clip(s), c)
		}
	}
	return nil
}

// checkBridgeCIDR accepts an IPv4 host address with a prefix of 16 to 29 bits that is neither
// the network nor the broadcast address.
func checkBridgeCIDR(p netip.Prefix) error {
	if !p.IsValid() || !p.Addr().Is4() {
		return invalidf("--bridge-cidr %s: want an IPv4 address with prefix length, like %s", p, DefaultBridgeCIDR)
	}
	if p.Bits() < 16 || p.Bits() > 29 {
		return invalidf("--bridge-cidr %s: want a prefix length of 16 to 29", p)
	}
	if p.Addr() == p.Masked().Addr() || p.Addr() == broadcast(p) {
		return invalidf("--bridge-cidr %s: the bridge address must be a host address", p)
	}
	return nil
}

func alnum(c byte) bool { return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// String describes c for logs without the nonce.
func (c Config) String() string {
	return fmt.Sprintf("instance %s, %s, %d cpus, %d MiB, %d GiB disk, bridge %s %s, deadline %s",
		c.InstanceID, c.Hypervisor, c.CPUs, c.MemoryMiB, c.DiskGiB, c.Bridge, c.BridgeCIDR, c.Deadline)
}
