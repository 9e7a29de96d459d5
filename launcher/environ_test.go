package launcher

import (
	"io"
	"maps"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEnvironRoundTrip: what a worker writes with Environ, ParseFlags reads back unchanged.
func TestEnvironRoundTrip(t *testing.T) {
	dir := testFiles(t)
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"defaults", func(*Config) {}},
		{"everything", func(c *Config) {
			c.Initramfs, c.Cmdline = filepath.Join(dir, "initrd"), "console=ttyS0 quiet"
			c.CPUs, c.MemoryMiB, c.DiskGiB = 3, 512, 4
			c.Bridge, c.BridgeCIDR = "br9", netip.MustParsePrefix("10.213.0.1/16")
			c.DNS = []netip.Addr{netip.MustParseAddr("10.213.0.1"), netip.MustParseAddr("9.9.9.9")}
			c.Hypervisor, c.Deadline = HypervisorQEMU, 90*time.Minute
			c.ConsoleLog = filepath.Join(dir, "console.log")
		}},
		{"firmware, odd deadline", func(c *Config) {
			c.Kernel, c.Firmware = "", filepath.Join(dir, "fw")
			c.Deadline = 2*time.Hour + 3*time.Second
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := validConfig(t, dir)
			tc.edit(&want)
			require.NoError(t, want.Validate())
			env := want.Environ()
			got, err := ParseFlags(nil, func(k string) string { return env[k] }, io.Discard)
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

func TestEnvironNames(t *testing.T) {
	assert.Equal(t, EnvInstanceID, EnvName("instance-id"))
	assert.Equal(t, EnvNonce, EnvName("nonce"))
	assert.Equal(t, EnvEndpoint, EnvName("endpoint"))

	// A worker's settings for all launches leave each launch's own out, and write the
	// deadline as an operator would.
	c := DefaultConfig()
	c.Image, c.Root = "/srv/base.qcow2", "/srv/vms"
	assert.Equal(t, map[string]string{
		"DYNRUNNER_LAUNCH_IMAGE": "/srv/base.qcow2", "DYNRUNNER_LAUNCH_ROOT": "/srv/vms",
		"DYNRUNNER_LAUNCH_CPUS": "2", "DYNRUNNER_LAUNCH_MEMORY_MIB": "2048", "DYNRUNNER_LAUNCH_DISK_GIB": "20",
		"DYNRUNNER_LAUNCH_BRIDGE": "dynrunner0", "DYNRUNNER_LAUNCH_BRIDGE_CIDR": "10.213.0.1/24",
		"DYNRUNNER_LAUNCH_HYPERVISOR": "cloud-hypervisor", "DYNRUNNER_LAUNCH_DEADLINE": "6h",
	}, c.Environ())
	assert.Empty(t, Config{}.Environ()["DYNRUNNER_LAUNCH_BRIDGE_CIDR"])
}

// TestInstanceEnv: a launch's own variables, added to the settings of all launches, are
// Environ of the whole configuration; InstanceEnv holds nothing else, and nothing unset.
func TestInstanceEnv(t *testing.T) {
	dir := testFiles(t)
	want := validConfig(t, dir)
	all := want
	all.InstanceID, all.Nonce, all.Endpoint = InstanceID{}, Nonce{}, Endpoint{}
	own := Config{InstanceID: want.InstanceID, Nonce: want.Nonce, Endpoint: want.Endpoint}.InstanceEnv()
	assert.Equal(t, map[string]string{
		EnvInstanceID: want.InstanceID.String(), EnvNonce: want.Nonce.Reveal(), EnvEndpoint: want.Endpoint.String(),
	}, own)
	env := all.Environ()
	maps.Copy(env, own)
	assert.Equal(t, want.Environ(), env)
	got, err := ParseFlags(nil, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Empty(t, Config{}.InstanceEnv())
	assert.Empty(t, DefaultConfig().InstanceEnv())
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		6 * time.Hour: "6h", 90 * time.Minute: "1h30m", 3 * time.Minute: "3m", 90 * time.Second: "1m30s",
		2*time.Hour + 3*time.Second: "2h0m3s", time.Second: "1s", 1500 * time.Millisecond: "1.5s",
	} {
		assert.Equal(t, want, shortDuration(d), d.String())
		back, err := time.ParseDuration(shortDuration(d))
		require.NoError(t, err)
		assert.Equal(t, d, back)
	}
}
