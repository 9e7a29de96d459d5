package docker

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/podworker"
)

func newTestBackend(t *testing.T, edit func(*Config)) *Backend {
	t.Helper()
	cfg := Config{Image: "sha256:" + strings.Repeat("ab", 32), StateDir: t.TempDir()}
	if edit != nil {
		edit(&cfg)
	}
	if os.Geteuid() != 0 && cfg.User == "" {
		// A controller that is not root can only run containers as its own uid.
		cfg.User = fmt.Sprintf("%d:%d", os.Geteuid(), os.Getegid())
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestContainerConfigHardenedByDefault(t *testing.T) {
	b := newTestBackend(t, nil)
	spec := podworker.Spec{Task: 7, Epoch: 9, Env: map[string]string{"B": "2", "A": "1", "HOME": "/root", "DYNRUNNER_SECRETS_DIR": "/elsewhere"}}
	c := b.containerConfig(spec, "/state/dynrunner-7-9/secrets")
	hc := c.HostConfig
	if !slices.Equal(hc.CapDrop, []string{"ALL"}) || hc.Privileged || !hc.ReadonlyRootfs || !hc.Init ||
		!slices.Equal(hc.SecurityOpt, []string{"no-new-privileges:true"}) || hc.IpcMode != "private" {
		t.Errorf("host config not hardened: %+v", hc)
	}
	if hc.Memory != DefaultMemory || hc.MemorySwap != DefaultMemory || hc.NanoCpus != 2e9 || hc.PidsLimit != DefaultPids || hc.NetworkMode != DefaultNetwork {
		t.Errorf("limits: %+v", hc)
	}
	if hc.RestartPolicy.Name != "no" {
		t.Errorf("restart policy %q, want no", hc.RestartPolicy.Name)
	}
	if (os.Geteuid() == 0 && c.User != DefaultUser) || c.WorkingDir != WorkDir || c.Image != b.image {
		t.Errorf("user %q, working dir %q, image %q", c.User, c.WorkingDir, c.Image)
	}
	want := []string{"A=1", "B=2", "DYNRUNNER_SECRETS_DIR=" + SecretsDir, "DYNRUNNER_WORK_DIR=" + WorkDir, "HOME=" + HomeDir, "TMPDIR=" + TmpDir}
	if !slices.Equal(c.Env, want) {
		t.Errorf("env = %q, want %q (the backend's own variables win)", c.Env, want)
	}
	if len(hc.Mounts) != 1 || hc.Mounts[0] != (mount{Type: "bind", Source: "/state/dynrunner-7-9/secrets", Target: SecretsDir, ReadOnly: true}) {
		t.Errorf("mounts = %+v", hc.Mounts)
	}
	for dir, want := range map[string]string{TmpDir: "mode=1777", WorkDir: "mode=0700,uid=", HomeDir: "mode=0700,uid="} {
		if opts := hc.Tmpfs[dir]; !strings.Contains(opts, "nosuid,nodev") || !strings.Contains(opts, want) || !strings.Contains(opts, "exec") {
			t.Errorf("tmpfs %s = %q, want exec,nosuid,nodev and %s", dir, opts, want)
		}
	}
	if c.Labels[LabelManaged] != "true" || c.Labels[LabelScope] != DefaultScope || c.Labels[LabelTask] != "7" || c.Labels[LabelEpoch] != "9" {
		t.Errorf("labels = %v", c.Labels)
	}
}

// TestContainerConfigWorkloadAPI: with a SPIRE agent socket, the socket's directory is
// mounted read-only and the executor is pointed at the socket inside the container.
func TestContainerConfigWorkloadAPI(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.SpiffeSocket = "unix:///run/spire/agent-sockets/api.sock" })
	c := b.containerConfig(podworker.Spec{Task: 7, Epoch: 9, Env: map[string]string{"SPIFFE_ENDPOINT_SOCKET": "unix:///elsewhere"}}, "/s")
	want := []mount{
		{Type: "bind", Source: "/s", Target: SecretsDir, ReadOnly: true},
		{Type: "bind", Source: "/run/spire/agent-sockets", Target: SpiffeSocketDir, ReadOnly: true},
	}
	if !slices.Equal(c.HostConfig.Mounts, want) {
		t.Errorf("mounts = %+v, want %+v", c.HostConfig.Mounts, want)
	}
	if !slices.Contains(c.Env, "SPIFFE_ENDPOINT_SOCKET=unix:///run/spire/sockets/api.sock") || slices.Contains(c.Env, "SPIFFE_ENDPOINT_SOCKET=unix:///elsewhere") {
		t.Errorf("env = %q, want SPIFFE_ENDPOINT_SOCKET naming the mounted socket only", c.Env)
	}
	// Without one, nothing of SPIRE reaches the container.
	c = newTestBackend(t, nil).containerConfig(podworker.Spec{Task: 7, Epoch: 9}, "/s")
	if len(c.HostConfig.Mounts) != 1 || slices.ContainsFunc(c.Env, func(e string) bool { return strings.HasPrefix(e, "SPIFFE_ENDPOINT_SOCKET=") }) {
		t.Errorf("without a socket: mounts %+v, env %q", c.HostConfig.Mounts, c.Env)
	}
}

func TestContainerConfigPrivilegedOptIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a privileged container runs as root by default, which needs a controller running as root; run the tests as root")
	}
	b := newTestBackend(t, func(c *Config) { c.Privileged = true; c.Memory = 1 << 30 })
	c := b.containerConfig(podworker.Spec{Task: 1, Epoch: 1}, "/s")
	hc := c.HostConfig
	if !hc.Privileged || len(hc.CapDrop) != 0 || c.User != "0:0" {
		t.Errorf("privileged: Privileged %v, CapDrop %v, User %q; want true, none, 0:0", hc.Privileged, hc.CapDrop, c.User)
	}
	// What Privileged does not give up.
	if !hc.ReadonlyRootfs || hc.Memory != 1<<30 || hc.PidsLimit != DefaultPids || !slices.Contains(hc.SecurityOpt, "no-new-privileges:true") {
		t.Errorf("privileged container lost its read-only root, limits or no-new-privileges: %+v", hc)
	}
	explicit := newTestBackend(t, func(c *Config) { c.Privileged = true; c.User = "1000:1000" })
	if u := explicit.containerConfig(podworker.Spec{Task: 1, Epoch: 1}, "/s").User; u != "1000:1000" {
		t.Errorf("privileged with an explicit user runs as %q", u)
	}
}

func TestEnvNames(t *testing.T) {
	def := newTestBackend(t, nil)
	scoped := newTestBackend(t, func(c *Config) { c.Scope = "ci7" })
	for _, tt := range []struct {
		b    *Backend
		name string
		ok   bool
	}{
		{def, "dynrunner-12-3", true},
		{scoped, "dynrunner-ci7-12-3", true},
		{def, "dynrunner-ci7-12-3", false},
		{scoped, "dynrunner-12-3", false},
		{def, "dynrunner-012-3", false},
		{def, "dynrunner-12-0", false},
		{def, "other-12-3", false},
		{def, "dynrunner-12", false},
	} {
		task, epoch, ok := tt.b.parseEnvName(tt.name)
		if ok != tt.ok || (ok && tt.b.envName(task, epoch) != tt.name) {
			t.Errorf("parseEnvName(%q) in scope %s = %d, %d, %v; want ok %v", tt.name, tt.b.scope, task, epoch, ok, tt.ok)
		}
	}
}

func FuzzDemux(f *testing.F) {
	frame := func(stream byte, s string) []byte {
		n := len(s)
		return append([]byte{stream, 0, 0, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, s...)
	}
	f.Add(append(frame(1, "out\n"), frame(2, "err\n")...))
	f.Add(frame(2, "partial"))
	f.Add([]byte{2, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := io.ReadAll(demux(bytes.NewReader(data), 2))
		require.NoError(t, err)
		assert.Equal(t, refDemux(data, 2), got, "demux disagrees with the reference on %x", data)
	})
}

// refDemux is the engine's multiplexed log format decoded whole: frames of an 8-byte header
// (stream, 3 zero bytes, big-endian length) and that many bytes; the payloads of stream, a cut
// last frame's part included, concatenated; an incomplete header ends it.
func refDemux(data []byte, stream byte) []byte {
	out := []byte{}
	for len(data) >= 8 {
		n := int(binary.BigEndian.Uint32(data[4:8]))
		payload := data[8:]
		if n < len(payload) {
			payload = payload[:n]
		}
		if data[0] == stream {
			out = append(out, payload...)
		}
		data = data[8+len(payload):]
	}
	return out
}

func TestDemux(t *testing.T) {
	frame := func(stream byte, s string) []byte {
		n := len(s)
		return append([]byte{stream, 0, 0, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, s...)
	}
	var in []byte
	in = append(in, frame(1, "stdout 1\n")...)
	in = append(in, frame(2, "stderr ")...)
	in = append(in, frame(1, "stdout 2\n")...)
	in = append(in, frame(2, "line\n")...)
	in = append(in, frame(2, "cut")[:9]...)
	got, err := io.ReadAll(demux(bytes.NewReader(in), 2))
	if err != nil || string(got) != "stderr line\nc" {
		t.Errorf("demux = %q, %v; want %q", got, err, "stderr line\nc")
	}
}
