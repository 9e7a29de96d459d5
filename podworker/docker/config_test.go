package docker

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
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
	require.NoError(t, err)
	return b
}

func TestContainerConfigHardenedByDefault(t *testing.T) {
	b := newTestBackend(t, nil)
	spec := podworker.Spec{Task: 7, Epoch: 9, Env: map[string]string{"B": "2", "A": "1", "HOME": "/root", "DYNRUNNER_SECRETS_DIR": "/elsewhere"}}
	c, hc := b.containerConfig(spec, "/state/dynrunner-7-9/secrets")
	// Hardened.
	assert.Equal(t, []string{"ALL"}, hc.CapDrop, "capabilities dropped")
	assert.False(t, hc.Privileged, "privileged")
	assert.True(t, hc.ReadonlyRootfs, "read-only root")
	assert.Equal(t, ptr(true), hc.Init, "init")
	assert.Equal(t, []string{"no-new-privileges:true"}, hc.SecurityOpt, "security options")
	assert.Equal(t, container.IPCModePrivate, hc.IpcMode, "IPC mode")
	// Limits.
	assert.EqualValues(t, DefaultMemory, hc.Memory, "memory")
	assert.EqualValues(t, DefaultMemory, hc.MemorySwap, "memory and swap")
	assert.EqualValues(t, 2e9, hc.NanoCPUs, "CPUs")
	if assert.NotNil(t, hc.PidsLimit, "pids limit") {
		assert.EqualValues(t, DefaultPids, *hc.PidsLimit, "pids limit")
	}
	assert.EqualValues(t, DefaultNetwork, hc.NetworkMode, "network")
	assert.EqualValues(t, "no", hc.RestartPolicy.Name, "restart policy %q, want no", hc.RestartPolicy.Name)
	if os.Geteuid() == 0 {
		assert.Equal(t, DefaultUser, c.User, "user")
	}
	assert.Equal(t, WorkDir, c.WorkingDir, "working dir")
	assert.Equal(t, b.image, c.Image, "image")
	want := []string{"A=1", "B=2", "DYNRUNNER_SECRETS_DIR=" + SecretsDir, "DYNRUNNER_WORK_DIR=" + WorkDir, "HOME=" + HomeDir, "TMPDIR=" + TmpDir}
	assert.Equal(t, want, c.Env, "env: the backend's own variables win")
	assert.Equal(t, []mount.Mount{{Type: mount.TypeBind, Source: "/state/dynrunner-7-9/secrets", Target: SecretsDir, ReadOnly: true}}, hc.Mounts)
	for dir, want := range map[string]string{TmpDir: "mode=1777", WorkDir: "mode=0700,uid=", HomeDir: "mode=0700,uid="} {
		opts := hc.Tmpfs[dir]
		for _, o := range []string{"nosuid,nodev", want, "exec"} {
			assert.Contains(t, opts, o, "tmpfs %s", dir)
		}
	}
	for k, v := range map[string]string{LabelManaged: "true", LabelScope: DefaultScope, LabelTask: "7", LabelEpoch: "9"} {
		assert.Equal(t, v, c.Labels[k], "label %s", k)
	}
}

// TestContainerConfigWorkloadAPI: with a SPIRE agent socket, the socket's directory is
// mounted read-only and the executor is pointed at the socket inside the container.
func TestContainerConfigWorkloadAPI(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.SpiffeSocket = "unix:///run/spire/agent-sockets/api.sock" })
	c, hc := b.containerConfig(podworker.Spec{Task: 7, Epoch: 9, Env: map[string]string{"SPIFFE_ENDPOINT_SOCKET": "unix:///elsewhere"}}, "/s")
	want := []mount.Mount{
		{Type: mount.TypeBind, Source: "/s", Target: SecretsDir, ReadOnly: true},
		{Type: mount.TypeBind, Source: "/run/spire/agent-sockets", Target: SpiffeSocketDir, ReadOnly: true},
	}
	assert.Equal(t, want, hc.Mounts)
	assert.Contains(t, c.Env, "SPIFFE_ENDPOINT_SOCKET=unix:///run/spire/sockets/api.sock", "SPIFFE_ENDPOINT_SOCKET names the mounted socket")
	assert.NotContains(t, c.Env, "SPIFFE_ENDPOINT_SOCKET=unix:///elsewhere", "SPIFFE_ENDPOINT_SOCKET names the mounted socket only")
	// Without one, nothing of SPIRE reaches the container.
	c, hc = newTestBackend(t, nil).containerConfig(podworker.Spec{Task: 7, Epoch: 9}, "/s")
	assert.Len(t, hc.Mounts, 1, "without a socket: mounts")
	assert.False(t, slices.ContainsFunc(c.Env, func(e string) bool { return strings.HasPrefix(e, "SPIFFE_ENDPOINT_SOCKET=") }),
		"without a socket: env %q names one", c.Env)
}

// TestContainerConfigGitHubSlot: a GitHub slot's container gets its secrets directory
// writable, so the executor can remove the JIT configuration once read, and nothing of SPIRE
// even when the backend has an agent socket; its environment parses as a slot's.
func TestContainerConfigGitHubSlot(t *testing.T) {
	b := newTestBackend(t, func(c *Config) { c.SpiffeSocket = "unix:///run/spire/agent-sockets/api.sock" })
	slot := assignment.TaskID(1<<52 + 3)
	env := executor.GitHubConfig{Task: slot, Epoch: 9, RunnerBin: "/usr/local/bin/github-runner", RunnerSHA256: strings.Repeat("cd", 32), LogFormat: "json"}.Environ()
	c, hc := b.containerConfig(podworker.Spec{Task: slot, Epoch: 9, Env: env}, "/s")
	assert.Equal(t, []mount.Mount{{Type: mount.TypeBind, Source: "/s", Target: SecretsDir, ReadOnly: false}}, hc.Mounts)
	assert.False(t, slices.ContainsFunc(c.Env, func(e string) bool { return strings.HasPrefix(e, "SPIFFE_ENDPOINT_SOCKET=") }),
		"a slot's env %q names a Workload API", c.Env)
	assert.True(t, hc.ReadonlyRootfs, "read-only root")
	assert.Equal(t, []string{"ALL"}, hc.CapDrop, "capabilities dropped")
	got, err := executor.ParseGitHubEnv(func(k string) string {
		for _, kv := range c.Env {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return ""
	})
	require.NoError(t, err)
	assert.Equal(t, executor.GitHubConfig{Task: slot, Epoch: 9, SecretsDir: SecretsDir, WorkDir: WorkDir,
		RunnerBin: "/usr/local/bin/github-runner", RunnerSHA256: strings.Repeat("cd", 32), LogFormat: "json"}, got)
}

// TestContainerEnvParses: executor.ParseEnv reads the container's environment, built from
// the variables a pod worker gives (podworkertest.WorkerEnv), back as the worker's
// configuration with the container's own directories and, with a SPIRE agent socket, the
// socket as mounted.
func TestContainerEnvParses(t *testing.T) {
	for _, tc := range []struct {
		name, agent, controller, want string
	}{
		{"workload api", "unix:///run/spire/agent-sockets/api.sock", "unix:///run/spire/agent-sockets/api.sock", "unix://" + SpiffeSocketDir + "/api.sock"},
		{"svid files", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, func(c *Config) { c.SpiffeSocket = tc.agent })
			want := podworkertest.ExecutorConfig(7, 9)
			want.SpiffeEndpointSocket = tc.controller
			c, _ := b.containerConfig(podworker.Spec{Task: 7, Epoch: 9, Env: podworkertest.WorkerEnv(want)}, "/s")
			env := map[string]string{}
			for _, kv := range c.Env {
				k, v, _ := strings.Cut(kv, "=")
				require.NotContains(t, env, k, "%s set twice", k)
				env[k] = v
			}
			got, err := executor.ParseEnv(func(k string) string { return env[k] })
			require.NoError(t, err)
			want.SecretsDir, want.WorkDir, want.SpiffeEndpointSocket = SecretsDir, WorkDir, tc.want
			assert.Equal(t, want, got)
		})
	}
}

func TestContainerConfigPrivilegedOptIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a privileged container runs as root by default, which needs a controller running as root; run the tests as root")
	}
	b := newTestBackend(t, func(c *Config) { c.Privileged = true; c.Memory = 1 << 30 })
	c, hc := b.containerConfig(podworker.Spec{Task: 1, Epoch: 1}, "/s")
	assert.True(t, hc.Privileged, "privileged")
	assert.Empty(t, hc.CapDrop, "privileged: capabilities dropped")
	assert.Equal(t, "0:0", c.User, "privileged: user")
	// What Privileged does not give up.
	assert.True(t, hc.ReadonlyRootfs, "privileged: read-only root")
	assert.EqualValues(t, 1<<30, hc.Memory, "privileged: memory")
	if assert.NotNil(t, hc.PidsLimit, "privileged: pids limit") {
		assert.EqualValues(t, DefaultPids, *hc.PidsLimit, "privileged: pids limit")
	}
	assert.Contains(t, hc.SecurityOpt, "no-new-privileges:true", "privileged: no-new-privileges")
	explicit := newTestBackend(t, func(c *Config) { c.Privileged = true; c.User = "1000:1000" })
	u, _ := explicit.containerConfig(podworker.Spec{Task: 1, Epoch: 1}, "/s")
	assert.Equal(t, "1000:1000", u.User, "privileged with an explicit user")
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
		assert.Equal(t, tt.ok, ok, "parseEnvName(%q) in scope %s = %d, %d", tt.name, tt.b.scope, task, epoch)
		if ok {
			assert.Equal(t, tt.name, tt.b.envName(task, epoch), "parseEnvName(%q) in scope %s", tt.name, tt.b.scope)
		}
	}
}

// frame is one frame of the engine's multiplexed log stream: stream (1 stdout, 2 stderr),
// three zero bytes, the big-endian length, the payload.
func frame(stream byte, s string) []byte {
	n := len(s)
	return append([]byte{stream, 0, 0, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, s...)
}

func TestLastExecutorError(t *testing.T) {
	tests := []struct {
		name   string
		stream []byte
		want   string
	}{
		{"none", nil, ""},
		{"stderr only", slices.Concat(
			frame(2, "dynrunner executor: first\n"),
			frame(2, "a log line\n"),
			frame(2, "  dynrunner executor: last  \n"),
			frame(2, "another log line\n"),
		), "dynrunner executor: last"},
		{"a line split over frames", slices.Concat(
			frame(2, "dynrunner exec"),
			frame(1, "dynrunner executor: the job's line\n"),
			frame(2, "utor: split\n"),
		), "dynrunner executor: split"},
		{"the job's stdout never counts", slices.Concat(
			frame(2, "dynrunner executor: from stderr\n"),
			frame(1, "dynrunner executor: from stdout\n"),
		), "dynrunner executor: from stderr"},
		{"no newline at the end", frame(2, "dynrunner executor: cut"), "dynrunner executor: cut"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := lastExecutorError(bytes.NewReader(tt.stream))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// FuzzLastExecutorError: whatever a job writes to stdout and stderr, and however the engine
// frames it, Diagnose's reading of the log stream finds exactly the last executor error line
// of stderr; the job's stdout never becomes a diagnosis.
func FuzzLastExecutorError(f *testing.F) {
	f.Add("dynrunner executor: on stdout\n", "dynrunner executor: on stderr\nmore\n", uint8(3))
	f.Add("", "dynrunner executor: a\r\ndynrunner executor: b", uint8(0))
	f.Add("dynrunner executor: x\n", "log\n", uint8(200))
	f.Fuzz(func(t *testing.T, stdout, stderr string, chunk uint8) {
		size := int(chunk)%32 + 1
		var stream []byte
		for out, errs := stdout, stderr; out != "" || errs != ""; {
			n := min(size, len(out))
			if n > 0 {
				stream = append(stream, frame(1, out[:n])...)
			}
			out = out[n:]
			n = min(size, len(errs))
			if n > 0 {
				stream = append(stream, frame(2, errs[:n])...)
			}
			errs = errs[n:]
		}
		got, err := lastExecutorError(bytes.NewReader(stream))
		require.NoError(t, err)
		want := ""
		for line := range strings.SplitSeq(stderr, "\n") {
			if s := strings.TrimSpace(line); strings.HasPrefix(s, podworker.ExecutorErrorPrefix) {
				want = s
			}
		}
		assert.Equal(t, want, got, "stream %x", stream)
	})
}

func ptr[T any](v T) *T { return &v }

func TestCheckRunner(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	other := strings.Repeat("cd", 32)
	tests := []struct {
		name    string
		labels  map[string]string
		want    string
		wantErr bool
	}{
		{name: "same runner", labels: map[string]string{LabelRunnerSHA256: sha}, want: sha},
		{name: "another runner", labels: map[string]string{LabelRunnerSHA256: other}, want: sha, wantErr: true},
		{name: "image without the label", labels: map[string]string{"other": "x"}, want: sha},
		{name: "image without labels", want: sha},
		{name: "no runner asked for", labels: map[string]string{LabelRunnerSHA256: other}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkRunner("sha256:"+sha, tt.labels, tt.want)
			if !tt.wantErr {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrRunnerMismatch)
			assert.ErrorContains(t, err, other, "the error names the image's runner")
		})
	}
}
