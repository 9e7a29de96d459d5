package launcher

import (
	"errors"
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	testID    = "0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	testNonce = "NONCE_abcdefghij-0123456789"
)

// testFiles creates regular files image, vmlinuz and initrd in a new directory.
func testFiles(t *testing.T) (dir string) {
	t.Helper()
	dir = t.TempDir()
	for _, n := range []string{"image", "vmlinuz", "initrd", "fw"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(n), 0o600))
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, "adir"), 0o700))
	return dir
}

func validConfig(t *testing.T, dir string) Config {
	t.Helper()
	c := DefaultConfig()
	var err error
	c.InstanceID, err = ParseInstanceID(testID)
	require.NoError(t, err)
	c.Nonce, err = ParseNonce(testNonce)
	require.NoError(t, err)
	c.Endpoint, err = ParseEndpoint("http://10.213.0.1:8080")
	require.NoError(t, err)
	c.Image = filepath.Join(dir, "image")
	c.Kernel = filepath.Join(dir, "vmlinuz")
	c.Root = filepath.Join(dir, "root")
	return c
}

func TestValidate(t *testing.T) {
	dir := testFiles(t)
	tests := []struct {
		name   string
		modify func(*Config)
		ok     bool
	}{
		{name: "valid", modify: func(*Config) {}, ok: true},
		{name: "qemu without kernel boots the disk", modify: func(c *Config) { c.Hypervisor = HypervisorQEMU; c.Kernel = "" }, ok: true},
		{name: "cloud-hypervisor with firmware", modify: func(c *Config) { c.Kernel = ""; c.Firmware = filepath.Join(dir, "fw") }, ok: true},
		{name: "initramfs and cmdline", modify: func(c *Config) {
			c.Initramfs = filepath.Join(dir, "initrd")
			c.Cmdline = "console=ttyS0 root=/dev/vda rw quiet"
		}, ok: true},
		{name: "no instance id", modify: func(c *Config) { c.InstanceID = InstanceID{} }},
		{name: "no nonce", modify: func(c *Config) { c.Nonce = Nonce{} }},
		{name: "no endpoint", modify: func(c *Config) { c.Endpoint = Endpoint{} }},
		{name: "no image", modify: func(c *Config) { c.Image = "" }},
		{name: "relative image", modify: func(c *Config) { c.Image = "image" }},
		{name: "dot-dot image", modify: func(c *Config) { c.Image = dir + "/adir/../image" }},
		{name: "unclean image", modify: func(c *Config) { c.Image = dir + "//image" }},
		{name: "trailing slash", modify: func(c *Config) { c.Image = dir + "/image/" }},
		{name: "image is a directory", modify: func(c *Config) { c.Image = dir + "/adir" }},
		{name: "missing image", modify: func(c *Config) { c.Image = dir + "/nope" }},
		{name: "image with semicolon", modify: func(c *Config) { c.Image = dir + "/image;rm -rf x" }},
		{name: "image with command substitution", modify: func(c *Config) { c.Image = dir + "/$(id)" }},
		{name: "image with backticks", modify: func(c *Config) { c.Image = dir + "/`id`" }},
		{name: "image with space", modify: func(c *Config) { c.Image = dir + "/a b" }},
		{name: "image with comma (breaks option strings)", modify: func(c *Config) { c.Image = dir + "/a,b" }},
		{name: "image with colon", modify: func(c *Config) { c.Image = dir + "/a:b" }},
		{name: "image with newline", modify: func(c *Config) { c.Image = dir + "/a\nb" }},
		{name: "image with pipe", modify: func(c *Config) { c.Image = dir + "/a|b" }},
		{name: "relative kernel", modify: func(c *Config) { c.Kernel = "vmlinuz" }},
		{name: "dot-dot kernel", modify: func(c *Config) { c.Kernel = dir + "/../vmlinuz" }},
		{name: "initramfs without kernel", modify: func(c *Config) { c.Kernel = ""; c.Hypervisor = HypervisorQEMU; c.Initramfs = dir + "/initrd" }},
		{name: "cmdline without kernel", modify: func(c *Config) { c.Kernel = ""; c.Hypervisor = HypervisorQEMU; c.Cmdline = "quiet" }},
		{name: "kernel and firmware", modify: func(c *Config) { c.Firmware = dir + "/fw" }},
		{name: "cloud-hypervisor without kernel or firmware", modify: func(c *Config) { c.Kernel = "" }},
		{name: "cmdline with newline", modify: func(c *Config) { c.Cmdline = "quiet\ninit=/bin/sh" }},
		{name: "cmdline with NUL", modify: func(c *Config) { c.Cmdline = "quiet\x00" }},
		{name: "cmdline too long", modify: func(c *Config) { c.Cmdline = strings.Repeat("a", maxCmdlineLen+1) }},
		{name: "zero cpus", modify: func(c *Config) { c.CPUs = 0 }},
		{name: "too many cpus", modify: func(c *Config) { c.CPUs = maxCPUs + 1 }},
		{name: "too little memory", modify: func(c *Config) { c.MemoryMiB = 64 }},
		{name: "zero disk", modify: func(c *Config) { c.DiskGiB = 0 }},
		{name: "zero deadline", modify: func(c *Config) { c.Deadline = 0 }},
		{name: "negative deadline", modify: func(c *Config) { c.Deadline = -time.Second }},
		{name: "long bridge name", modify: func(c *Config) { c.Bridge = "dynrunner-bridge0" }},
		{name: "bridge with slash", modify: func(c *Config) { c.Bridge = "a/b" }},
		{name: "bridge with space", modify: func(c *Config) { c.Bridge = "a b" }},
		{name: "empty bridge", modify: func(c *Config) { c.Bridge = "" }},
		{name: "bridge cidr network address", modify: func(c *Config) { c.BridgeCIDR = netip.MustParsePrefix("10.213.0.0/24") }},
		{name: "bridge cidr broadcast", modify: func(c *Config) { c.BridgeCIDR = netip.MustParsePrefix("10.213.0.255/24") }},
		{name: "bridge cidr /30", modify: func(c *Config) { c.BridgeCIDR = netip.MustParsePrefix("10.213.0.1/30") }},
		{name: "bridge cidr ipv6", modify: func(c *Config) { c.BridgeCIDR = netip.MustParsePrefix("fd00::1/64") }},
		{name: "endpoint off the bridge", modify: func(c *Config) { c.Endpoint.Addr = netip.MustParseAddrPort("10.0.0.1:8080") }},
		{name: "endpoint on another host of the bridge", modify: func(c *Config) { c.Endpoint.Addr = netip.MustParseAddrPort("10.213.0.9:8080") }, ok: true},
		{name: "unknown hypervisor", modify: func(c *Config) { c.Hypervisor = "firecracker" }},
		{name: "relative root", modify: func(c *Config) { c.Root = "var/lib/x" }},
		{name: "dot-dot root", modify: func(c *Config) { c.Root = "/var/lib/../../tmp" }},
		{name: "root too long for the socket", modify: func(c *Config) { c.Root = "/" + strings.Repeat("r", maxRootLen) }},
		{name: "console log below root", modify: func(c *Config) { c.ConsoleLog = c.Root + "/x.log" }},
		{name: "console log relative", modify: func(c *Config) { c.ConsoleLog = "x.log" }},
		{name: "console log", modify: func(c *Config) { c.ConsoleLog = dir + "/console.log" }, ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig(t, dir)
			tt.modify(&c)
			err := c.Validate()
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.True(t, strings.HasPrefix(err.Error(), "launcher: "), "error %q lacks the package prefix", err)
		})
	}
}

func TestParseFlags(t *testing.T) {
	dir := testFiles(t)
	image := filepath.Join(dir, "image")
	kernel := filepath.Join(dir, "vmlinuz")
	env := func(m map[string]string) func(string) string {
		return func(k string) string { return m[k] }
	}
	required := []string{"--instance-id", testID, "--nonce", testNonce, "--endpoint", "http://10.213.0.1:8080",
		"--image", image, "--kernel", kernel}

	t.Run("defaults", func(t *testing.T) {
		c, err := ParseFlags(required, env(nil), io.Discard)
		require.NoError(t, err)
		want := DefaultConfig()
		assert.Equal(t, want.CPUs, c.CPUs)
		assert.Equal(t, want.MemoryMiB, c.MemoryMiB)
		assert.Equal(t, want.DiskGiB, c.DiskGiB)
		assert.Equal(t, "dynrunner0", c.Bridge)
		assert.Equal(t, "10.213.0.1/24", c.BridgeCIDR.String())
		assert.Equal(t, "cloud-hypervisor", c.Hypervisor)
		assert.Equal(t, 6*time.Hour, c.Deadline)
		assert.Equal(t, "/var/lib/dynrunner/launcher", c.Root)
		assert.Equal(t, testID, c.InstanceID.String())
		assert.Equal(t, testNonce, c.Nonce.Reveal())
		assert.Equal(t, image, c.Image)
		assert.Equal(t, kernel, c.Kernel)
	})
	t.Run("everything from the environment", func(t *testing.T) {
		c, err := ParseFlags(nil, env(map[string]string{
			"DYNRUNNER_LAUNCH_INSTANCE_ID": testID,
			"DYNRUNNER_LAUNCH_NONCE":       testNonce,
			"DYNRUNNER_LAUNCH_ENDPOINT":    "http://10.9.0.1:99",
			"DYNRUNNER_LAUNCH_IMAGE":       image,
			"DYNRUNNER_LAUNCH_KERNEL":      kernel,
			"DYNRUNNER_LAUNCH_INITRAMFS":   filepath.Join(dir, "initrd"),
			"DYNRUNNER_LAUNCH_CMDLINE":     "console=ttyS0",
			"DYNRUNNER_LAUNCH_CPUS":        "3",
			"DYNRUNNER_LAUNCH_MEMORY_MIB":  "512",
			"DYNRUNNER_LAUNCH_DISK_GIB":    "4",
			"DYNRUNNER_LAUNCH_BRIDGE":      "br9",
			"DYNRUNNER_LAUNCH_BRIDGE_CIDR": "10.9.0.1/16",
			"DYNRUNNER_LAUNCH_HYPERVISOR":  "qemu",
			"DYNRUNNER_LAUNCH_DEADLINE":    "90m",
			"DYNRUNNER_LAUNCH_ROOT":        "/srv/launcher",
			"DYNRUNNER_LAUNCH_CONSOLE_LOG": "/var/log/x.log",
		}), io.Discard)
		require.NoError(t, err)
		assert.Equal(t, 3, c.CPUs)
		assert.Equal(t, 512, c.MemoryMiB)
		assert.Equal(t, 4, c.DiskGiB)
		assert.Equal(t, "br9", c.Bridge)
		assert.Equal(t, "10.9.0.1/16", c.BridgeCIDR.String())
		assert.Equal(t, "qemu", c.Hypervisor)
		assert.Equal(t, 90*time.Minute, c.Deadline)
		assert.Equal(t, "/srv/launcher", c.Root)
		assert.Equal(t, "console=ttyS0", c.Cmdline)
		assert.Equal(t, "/var/log/x.log", c.ConsoleLog)
		assert.Equal(t, "http://10.9.0.1:99", c.Endpoint.String())
		assert.Equal(t, testNonce, c.Nonce.Reveal())
	})
	t.Run("a flag beats its environment variable", func(t *testing.T) {
		c, err := ParseFlags(append(required, "--cpus", "4"), env(map[string]string{"DYNRUNNER_LAUNCH_CPUS": "1"}), io.Discard)
		require.NoError(t, err)
		assert.Equal(t, 4, c.CPUs)
	})
	t.Run("help", func(t *testing.T) {
		var out strings.Builder
		_, err := ParseFlags([]string{"-h"}, env(nil), &out)
		require.ErrorIs(t, err, flag.ErrHelp)
		assert.Contains(t, out.String(), EnvName("memory-mib"))
	})
	bad := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{name: "missing instance id", args: required[2:]},
		{name: "bad instance id flag", args: append(required, "--instance-id", "0B5E7D3A-1C2D-4E5F-8A9B-0C1D2E3F4A5B")},
		{name: "bad instance id env", args: required[2:], env: map[string]string{"DYNRUNNER_LAUNCH_INSTANCE_ID": "x"}},
		{name: "bad nonce", args: append(required, "--nonce", "short")},
		{name: "bad cpus", args: append(required, "--cpus", "two")},
		{name: "bad cpus env", args: required, env: map[string]string{"DYNRUNNER_LAUNCH_CPUS": "2;id"}},
		{name: "bad deadline", args: append(required, "--deadline", "forever")},
		{name: "bad cidr", args: append(required, "--bridge-cidr", "10.213.0.1")},
		{name: "unknown flag", args: append(required, "--token", "x")},
		{name: "positional argument", args: append(required, "extra")},
		{name: "path traversal", args: append(required, "--image", dir+"/adir/../image")},
		{name: "shell metacharacters", args: append(required, "--root", "/tmp/x;reboot")},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFlags(tt.args, env(tt.env), io.Discard)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.NotContains(t, err.Error(), testNonce, "the error shows the nonce")
		})
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{nil, 0},
		{invalidf("x"), 2},
		{errors.Join(errors.New("a"), ErrDeadline), 3},
		{ErrStopped, 4},
		{ErrHypervisorFailed, 5},
		{errors.New("other"), 1},
		{ErrNoDirectIO, 1},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, ExitCode(tt.err), "ExitCode(%v)", tt.err)
	}
}
