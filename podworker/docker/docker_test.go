package docker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/docker"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

const testTimeout = 60 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testScope is a scope of its own for each test, so tests (and a controller running on the same
// engine) never list or reap each other's containers.
func testScope(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

// newBackend returns a Backend over the test image, stateDir and scope; edit adjusts the Config.
func newBackend(t *testing.T, image, stateDir, scope string, edit func(*docker.Config)) *docker.Backend {
	t.Helper()
	cfg := docker.Config{
		Image:    image,
		StateDir: stateDir,
		Scope:    scope,
		Network:  docker.HostNetwork, // the fake executor needs none; TestIsolatedNetwork tests the default
		User:     testUser(),
		Grace:    5 * time.Second,
		Memory:   512 << 20,
		CPUs:     1,
		Log:      zerolog.New(zerolog.NewTestWriter(t)),
	}
	if edit != nil {
		edit(&cfg)
	}
	b, err := docker.New(cfg)
	require.NoError(t, err, "New")
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// testUser is the containers' user: the default when the tests run as root, else the tests'
// own uid, the only one a controller that is not root can give the secret files to.
func testUser() string {
	if os.Geteuid() == 0 {
		return docker.DefaultUser
	}
	return fmt.Sprintf("%d:%d", os.Geteuid(), os.Getegid())
}

// modes maps the conformance behaviors to fake executor modes.
var modes = map[podworkertest.Behavior]string{
	podworkertest.RunForever:        "forever",
	podworkertest.ExitZero:          "exit0",
	podworkertest.ExitNonZero:       "exit3",
	podworkertest.CheckSecrets:      "secrets",
	podworkertest.WriteFilesAndExit: "write-files",
}

func fakeSpec(task assignment.TaskID, mode string) podworker.Spec {
	return podworker.Spec{Task: task, Epoch: 1, Env: map[string]string{fakeEnv: mode}}
}

func TestConformance(t *testing.T) {
	image := testImage(t)
	state := t.TempDir()
	scope := testScope(t)
	podworkertest.RunConformance(t, podworkertest.Harness{
		New: func(t *testing.T) podworker.Backend { return newBackend(t, image, state, scope, nil) },
		Spec: func(t *testing.T, task assignment.TaskID, behavior podworkertest.Behavior) podworker.Spec {
			mode, ok := modes[behavior]
			require.True(t, ok, "no fake executor mode for %v", behavior)
			return fakeSpec(task, mode)
		},
		Gone:           gone(state),
		KnownExitCodes: true,
		Without:        map[string]string{podworkertest.CheckNeverReady: "Start returns once the container runs; an executor that never gets going is the worker's pickup timeout, not the backend's"},
		Timeout:        testTimeout,
	})
}

// gone reports whether the environment's container and its directory are gone, looked up
// independently of the package under test.
func gone(state string) func(t *testing.T, h podworker.Handle) bool {
	return func(t *testing.T, h podworker.Handle) bool {
		if _, err := os.Lstat(filepath.Join(state, h.ID)); !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		return !containerExists(t, h.ID)
	}
}

func containerExists(t *testing.T, ref string) bool {
	t.Helper()
	code, err := engineJSON(ctxT(t), http.MethodGet, "/containers/"+ref+"/json", nil, nil)
	require.NoError(t, err, "inspect %s", ref)
	return code != http.StatusNotFound
}

// inspection is what the tests read of a container.
type inspection struct {
	Config struct {
		User   string            `json:"User"`
		Env    []string          `json:"Env"`
		Labels map[string]string `json:"Labels"`
	} `json:"Config"`
	HostConfig struct {
		NetworkMode    string            `json:"NetworkMode"`
		Privileged     bool              `json:"Privileged"`
		CapDrop        []string          `json:"CapDrop"`
		SecurityOpt    []string          `json:"SecurityOpt"`
		ReadonlyRootfs bool              `json:"ReadonlyRootfs"`
		Init           *bool             `json:"Init"`
		Tmpfs          map[string]string `json:"Tmpfs"`
		Memory         int64             `json:"Memory"`
		MemorySwap     int64             `json:"MemorySwap"`
		NanoCpus       int64             `json:"NanoCpus"`
		PidsLimit      *int64            `json:"PidsLimit"`
	} `json:"HostConfig"`
	Mounts []struct {
		Source      string `json:"Source"`
		Destination string `json:"Destination"`
		RW          bool   `json:"RW"`
	} `json:"Mounts"`
}

func inspect(t *testing.T, h podworker.Handle) inspection {
	t.Helper()
	var c inspection
	code, err := engineJSON(ctxT(t), http.MethodGet, "/containers/"+h.Data["container_id"]+"/json", nil, &c)
	require.NoError(t, err, "inspect %s", h.ID)
	require.Equal(t, http.StatusOK, code, "inspect %s", h.ID)
	return c
}

func startT(t *testing.T, b *docker.Backend, spec podworker.Spec) podworker.Handle {
	t.Helper()
	h, err := b.Start(ctxT(t), spec)
	require.NoError(t, err, "Start")
	t.Cleanup(func() {
		assert.NoError(t, b.Destroy(context.Background(), h), "cleanup: Destroy")
	})
	return h
}

func waitT(t *testing.T, b *docker.Backend, h podworker.Handle) podworker.Exit {
	t.Helper()
	exit, err := b.Wait(ctxT(t), h)
	require.NoError(t, err, "Wait")
	if exit.Code != 0 {
		why, _ := b.Diagnose(ctxT(t), h)
		t.Logf("exit %+v; executor said %q", exit, why)
	}
	return exit
}

// TestHardening checks the container's configuration through the engine and, from inside, what
// the job sees: no capabilities, no-new-privileges, read-only root, non-root, the limits.
func TestHardening(t *testing.T) {
	image := testImage(t)
	state := t.TempDir()
	b := newBackend(t, image, state, testScope(t), func(c *docker.Config) {
		c.Memory, c.Pids, c.CPUs = hardenedMemory, hardenedPids, 0.5
	})
	spec := fakeSpec(41, "hardened")
	spec.Env[userEnv] = testUser()
	spec.Files = map[string][]byte{"token": []byte("secret")}
	h := startT(t, b, spec)
	c := inspect(t, h)
	hc := c.HostConfig
	if assert.Len(t, hc.CapDrop, 1, "CapDrop, want [ALL]") {
		assert.True(t, strings.EqualFold(hc.CapDrop[0], "ALL"), "CapDrop = %v, want [ALL]", hc.CapDrop)
	}
	if assert.Len(t, hc.SecurityOpt, 1, "SecurityOpt, want no-new-privileges") {
		assert.True(t, strings.HasPrefix(hc.SecurityOpt[0], "no-new-privileges"), "SecurityOpt = %v, want no-new-privileges", hc.SecurityOpt)
	}
	assert.True(t, hc.ReadonlyRootfs, "ReadonlyRootfs")
	assert.False(t, hc.Privileged, "Privileged")
	if assert.NotNil(t, hc.Init, "Init, want true") {
		assert.True(t, *hc.Init, "Init")
	}
	assert.Equal(t, int64(hardenedMemory), hc.Memory, "limits: memory")
	assert.Equal(t, int64(hardenedMemory), hc.MemorySwap, "limits: swap")
	assert.Equal(t, int64(5e8), hc.NanoCpus, "limits: nanocpus")
	if assert.NotNil(t, hc.PidsLimit, "limits: pids") {
		assert.Equal(t, int64(hardenedPids), *hc.PidsLimit, "limits: pids")
	}
	assert.Equal(t, docker.HostNetwork, hc.NetworkMode, "NetworkMode")
	for _, dir := range []string{docker.TmpDir, docker.WorkDir, docker.HomeDir} {
		if opts, ok := hc.Tmpfs[dir]; assert.True(t, ok, "tmpfs %s, want a nosuid,nodev tmpfs", dir) {
			assert.Contains(t, opts, "nosuid", "tmpfs %s", dir)
			assert.Contains(t, opts, "nodev", "tmpfs %s", dir)
		}
	}
	assert.Equal(t, testUser(), c.Config.User, "User")
	assert.Equal(t, "true", c.Config.Labels[docker.LabelManaged], "label %s", docker.LabelManaged)
	assert.Equal(t, "41", c.Config.Labels[docker.LabelTask], "label %s", docker.LabelTask)
	assert.Equal(t, "1", c.Config.Labels[docker.LabelEpoch], "label %s", docker.LabelEpoch)
	secrets := filepath.Join(state, h.ID, "secrets")
	if assert.Len(t, c.Mounts, 1, "mounts, want %s read-only at %s", secrets, docker.SecretsDir) {
		assert.Equal(t, secrets, c.Mounts[0].Source, "mount source")
		assert.Equal(t, docker.SecretsDir, c.Mounts[0].Destination, "mount destination")
		assert.False(t, c.Mounts[0].RW, "the secrets mount is writable")
	}
	if fi, err := os.Stat(secrets); assert.NoError(t, err, "secrets directory") {
		assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "secrets directory mode")
	}
	if fi, err := os.Stat(filepath.Join(secrets, "token")); assert.NoError(t, err, "secret file") {
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "secret file mode")
	}
	exit := waitT(t, b, h)
	require.Zero(t, exit.Code, "the check inside the container failed: %+v", exit)
}

func TestDiagnose(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	h := startT(t, b, fakeSpec(43, "diagnose"))
	assert.Equal(t, podworker.Exit{Code: 1, Reason: "exited"}, waitT(t, b, h), "exit")
	got, err := b.Diagnose(ctxT(t), h)
	assert.NoError(t, err, "Diagnose")
	assert.Equal(t, "dynrunner executor: wait for the SVID: context deadline exceeded", got, "Diagnose: stderr only, the last error line")
	require.NoError(t, b.Destroy(ctxT(t), h))
	_, err = b.Diagnose(ctxT(t), h)
	assert.ErrorIs(t, err, podworker.ErrNotFound, "Diagnose after Destroy")
}

// TestStartReplacesStopped checks that a Start finding its container stopped creates a new one
// and that a Destroy with the old handle leaves the new container and its secrets alone.
func TestStartReplacesStopped(t *testing.T) {
	image := testImage(t)
	state := t.TempDir()
	b := newBackend(t, image, state, testScope(t), nil)
	spec := fakeSpec(44, "exit0")
	old := startT(t, b, spec)
	waitT(t, b, old)
	spec.Env[fakeEnv] = "forever"
	spec.Files = map[string][]byte{"token": []byte("x")}
	cur := startT(t, b, spec)
	require.Equal(t, old.ID, cur.ID, "second Start: want the same name")
	require.NotEqual(t, old.Data["container_id"], cur.Data["container_id"], "second Start: want a new container")
	assert.False(t, containerExists(t, old.Data["container_id"]), "the stopped container %s still exists", old.Data["container_id"])
	require.NoError(t, b.Destroy(ctxT(t), old), "Destroy(old handle)")
	require.True(t, containerExists(t, cur.Data["container_id"]), "Destroy of the old handle removed the new container")
	_, err := os.Stat(filepath.Join(state, cur.ID, "secrets", "token"))
	require.NoError(t, err, "Destroy of the old handle removed the new container's secrets")
}

// TestListOrphansAndScopes checks that a secrets directory without a container is listed for
// reaping, and that a backend never lists another scope's containers.
func TestListOrphansAndScopes(t *testing.T) {
	image := testImage(t)
	state := t.TempDir()
	b := newBackend(t, image, state, testScope(t), nil)
	other := newBackend(t, image, t.TempDir(), testScope(t), nil)
	h := startT(t, b, fakeSpec(45, "forever"))
	orphan := strings.Replace(h.ID, "-45-", "-46-", 1)
	require.NoError(t, os.MkdirAll(filepath.Join(state, orphan, "secrets"), 0o700))
	all, err := b.List(ctxT(t))
	require.NoError(t, err)
	require.Len(t, all, 2, "List, want %s and the orphan %s", h.ID, orphan)
	require.Equal(t, h.ID, all[0].ID, "List")
	require.Equal(t, podworker.Handle{Backend: all[1].Backend, ID: orphan, Task: 46, Epoch: 1}, all[1], "List: the orphan (task 46, no data)")
	require.NoError(t, b.Destroy(ctxT(t), all[1]))
	_, err = os.Stat(filepath.Join(state, orphan))
	assert.ErrorIs(t, err, fs.ErrNotExist, "orphan directory after Destroy")
	theirs, err := other.List(ctxT(t))
	require.NoError(t, err)
	assert.Empty(t, theirs, "another scope lists")
}

// TestNotManaged checks that the backend never adopts or removes a container that has an
// environment's name but not its labels.
func TestNotManaged(t *testing.T) {
	image := testImage(t)
	scope := testScope(t)
	b := newBackend(t, image, t.TempDir(), scope, nil)
	name := "dynrunner-" + scope + "-47-1"
	body := strings.NewReader(`{"Image":"` + image + `","Env":["` + fakeEnv + `=exit0"]}`)
	var created struct {
		ID string `json:"Id"`
	}
	code, err := engineJSON(ctxT(t), http.MethodPost, "/containers/create?name="+name, body, &created)
	require.NoError(t, err, "create %s", name)
	require.Equal(t, http.StatusCreated, code, "create %s", name)
	t.Cleanup(func() {
		_, _ = engineJSON(context.Background(), http.MethodDelete, "/containers/"+created.ID+"?force=1", nil, nil)
	})
	_, err = b.Start(ctxT(t), fakeSpec(47, "forever"))
	assert.ErrorIs(t, err, docker.ErrNotManaged, "Start over a foreign container")
	h := podworker.Handle{Backend: "docker", ID: name, Task: 47, Epoch: 1}
	assert.ErrorIs(t, b.Destroy(ctxT(t), h), docker.ErrNotManaged, "Destroy of a foreign container")
	assert.True(t, containerExists(t, created.ID), "the foreign container was removed")
}

func TestCheck(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	assert.NoError(t, b.Check(ctxT(t)), "Check with the test image")
	missing := newBackend(t, "sha256:"+strings.Repeat("0", 64), t.TempDir(), testScope(t), nil)
	assert.ErrorIs(t, missing.Check(ctxT(t)), docker.ErrImageMissing, "Check with a missing image")
	broken := newBackend(t, image, t.TempDir(), testScope(t), func(c *docker.Config) { c.Socket = filepath.Join(t.TempDir(), "no.sock") })
	assert.Error(t, broken.Check(ctxT(t)), "Check against a missing socket succeeded")
}

func TestNewValidates(t *testing.T) {
	image := "sha256:" + strings.Repeat("ab", 32)
	dir := t.TempDir()
	ok := docker.Config{Image: image, StateDir: dir, User: testUser()}
	tests := []struct {
		name string
		edit func(*docker.Config)
	}{
		{"tag only", func(c *docker.Config) { c.Image = "dynrunner-executor:dev" }},
		{"name without digest", func(c *docker.Config) { c.Image = "registry.example/dynrunner" }},
		{"short digest", func(c *docker.Config) { c.Image = "sha256:abc" }},
		{"uppercase digest", func(c *docker.Config) { c.Image = "sha256:" + strings.Repeat("AB", 32) }},
		{"no image", func(c *docker.Config) { c.Image = "" }},
		{"relative state dir", func(c *docker.Config) { c.StateDir = "envs" }},
		{"relative socket", func(c *docker.Config) { c.Socket = "docker.sock" }},
		{"tiny memory", func(c *docker.Config) { c.Memory = 1 << 20 }},
		{"negative cpus", func(c *docker.Config) { c.CPUs = -1 }},
		{"few pids", func(c *docker.Config) { c.Pids = 2 }},
		{"user name", func(c *docker.Config) { c.User = "runner" }},
		{"network with colon", func(c *docker.Config) { c.Network = "container:other" }},
		{"scope with dash", func(c *docker.Config) { c.Scope = "a-b" }},
		{"negative grace", func(c *docker.Config) { c.Grace = -time.Second }},
		{"relative spiffe socket", func(c *docker.Config) { c.SpiffeSocket = "unix://agent.sock" }},
		{"spiffe socket in /", func(c *docker.Config) { c.SpiffeSocket = "/agent.sock" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			_, err := docker.New(cfg)
			assert.ErrorIs(t, err, docker.ErrInvalidConfig, "New(%+v)", cfg)
		})
	}
	for _, img := range []string{image, "registry.example/dynrunner/executor@sha256:" + strings.Repeat("0", 64),
		"localhost:5000/executor:v1@sha256:" + strings.Repeat("0", 64)} {
		cfg := ok
		cfg.Image = img
		_, err := docker.New(cfg)
		assert.NoError(t, err, "New with image %s", img)
	}
	if fi, err := os.Stat(dir); assert.NoError(t, err, "state directory") {
		assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "state directory mode")
	}
}

func TestRejectsBadHandles(t *testing.T) {
	b, err := docker.New(docker.Config{Image: "sha256:" + strings.Repeat("ab", 32), StateDir: t.TempDir(), User: testUser()})
	require.NoError(t, err)
	for _, h := range []podworker.Handle{
		{Backend: "local", ID: "dynrunner-1-1"},
		{Backend: "docker", ID: "../etc"},
		{Backend: "docker", ID: ""},
		{Backend: "docker", ID: "dynrunner-1-1", Data: map[string]string{"container_id": "abc"}},
	} {
		assert.ErrorIs(t, b.Destroy(t.Context(), h), docker.ErrInvalidHandle, "Destroy(%+v)", h)
		_, err := b.Wait(t.Context(), h)
		assert.ErrorIs(t, err, docker.ErrInvalidHandle, "Wait(%+v)", h)
	}
}

// TestInventory: the inventory of a scope lists its running environments and reports their
// changes, and Watch returns nil once its context ends.
func TestInventory(t *testing.T) {
	image := testImage(t)
	scope := testScope(t)
	b := newBackend(t, image, t.TempDir(), scope, nil)
	inv, err := docker.NewInventory("unix://"+docker.DefaultSocket, scope)
	require.NoError(t, err)
	t.Cleanup(func() { _ = inv.Close() })

	ctx, cancel := context.WithCancel(ctxT(t))
	changed := make(chan struct{}, 16)
	watched := make(chan error, 1)
	go func() {
		watched <- inv.Watch(ctx, func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		})
	}()
	// Watch may open its event stream only after the start: the listing is polled.
	h := startT(t, b, fakeSpec(48, "forever"))
	require.Eventually(t, func() bool {
		running, err := inv.Running(ctx)
		return err == nil && len(running) == 1 && running[0] == docker.Running{ContainerID: h.Data["container_id"], Task: 48, Epoch: 1}
	}, testTimeout, 50*time.Millisecond, "the running environment is listed")
	other, err := docker.NewInventory("", testScope(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	theirs, err := other.Running(ctx)
	require.NoError(t, err)
	assert.Empty(t, theirs, "another scope's inventory")

	for len(changed) > 0 { // the start's events
		<-changed
	}
	require.NoError(t, b.Destroy(ctx, h))
	select {
	case <-changed:
	case <-time.After(testTimeout):
		t.Fatal("Watch reported no change when the container was destroyed")
	}
	running, err := inv.Running(ctx)
	require.NoError(t, err)
	assert.Empty(t, running, "after Destroy")

	cancel()
	assert.NoError(t, <-watched, "Watch after its context ended")
}
