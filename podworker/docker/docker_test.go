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
	if err != nil {
		t.Fatalf("New: %v", err)
	}
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
			if !ok {
				t.Fatalf("no fake executor mode for %v", behavior)
			}
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
	if err != nil {
		t.Fatalf("inspect %s: %v", ref, err)
	}
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
	if err != nil || code != http.StatusOK {
		t.Fatalf("inspect %s: %d, %v", h.ID, code, err)
	}
	return c
}

func startT(t *testing.T, b *docker.Backend, spec podworker.Spec) podworker.Handle {
	t.Helper()
	h, err := b.Start(ctxT(t), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Destroy(context.Background(), h); err != nil {
			t.Errorf("cleanup: Destroy: %v", err)
		}
	})
	return h
}

func waitT(t *testing.T, b *docker.Backend, h podworker.Handle) podworker.Exit {
	t.Helper()
	exit, err := b.Wait(ctxT(t), h)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
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
	if len(hc.CapDrop) != 1 || !strings.EqualFold(hc.CapDrop[0], "ALL") {
		t.Errorf("CapDrop = %v, want [ALL]", hc.CapDrop)
	}
	if len(hc.SecurityOpt) != 1 || !strings.HasPrefix(hc.SecurityOpt[0], "no-new-privileges") {
		t.Errorf("SecurityOpt = %v, want no-new-privileges", hc.SecurityOpt)
	}
	if !hc.ReadonlyRootfs || hc.Privileged {
		t.Errorf("ReadonlyRootfs %v, Privileged %v; want true, false", hc.ReadonlyRootfs, hc.Privileged)
	}
	if hc.Init == nil || !*hc.Init {
		t.Errorf("Init = %v, want true", hc.Init)
	}
	if hc.Memory != hardenedMemory || hc.MemorySwap != hardenedMemory || hc.NanoCpus != 5e8 ||
		hc.PidsLimit == nil || *hc.PidsLimit != hardenedPids {
		t.Errorf("limits: memory %d swap %d nanocpus %d pids %v; want %d, %d, 5e8, %d",
			hc.Memory, hc.MemorySwap, hc.NanoCpus, hc.PidsLimit, hardenedMemory, hardenedMemory, hardenedPids)
	}
	if hc.NetworkMode != docker.HostNetwork {
		t.Errorf("NetworkMode = %q, want %q", hc.NetworkMode, docker.HostNetwork)
	}
	for _, dir := range []string{docker.TmpDir, docker.WorkDir, docker.HomeDir} {
		if opts, ok := hc.Tmpfs[dir]; !ok || !strings.Contains(opts, "nosuid") || !strings.Contains(opts, "nodev") {
			t.Errorf("tmpfs %s: %q, want a nosuid,nodev tmpfs", dir, opts)
		}
	}
	if c.Config.User != testUser() {
		t.Errorf("User = %q, want %q", c.Config.User, testUser())
	}
	if c.Config.Labels[docker.LabelManaged] != "true" || c.Config.Labels[docker.LabelTask] != "41" || c.Config.Labels[docker.LabelEpoch] != "1" {
		t.Errorf("labels %v", c.Config.Labels)
	}
	secrets := filepath.Join(state, h.ID, "secrets")
	if len(c.Mounts) != 1 || c.Mounts[0].Source != secrets || c.Mounts[0].Destination != docker.SecretsDir || c.Mounts[0].RW {
		t.Errorf("mounts %+v, want %s read-only at %s", c.Mounts, secrets, docker.SecretsDir)
	}
	if fi, err := os.Stat(secrets); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("secrets directory: %v, %v; want mode 0700", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(secrets, "token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("secret file: %v, %v; want mode 0600", fi, err)
	}
	if exit := waitT(t, b, h); exit.Code != 0 {
		t.Fatalf("the check inside the container failed: %+v", exit)
	}
}

func TestDiagnose(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	h := startT(t, b, fakeSpec(43, "diagnose"))
	if exit := waitT(t, b, h); exit.Code != 1 || exit.Reason != "exited" {
		t.Errorf("exit = %+v, want code 1, exited", exit)
	}
	got, err := b.Diagnose(ctxT(t), h)
	if want := "dynrunner executor: wait for the SVID: context deadline exceeded"; err != nil || got != want {
		t.Errorf("Diagnose = %q, %v; want %q (stderr only, the last error line)", got, err, want)
	}
	if err := b.Destroy(ctxT(t), h); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Diagnose(ctxT(t), h); !errors.Is(err, podworker.ErrNotFound) {
		t.Errorf("Diagnose after Destroy = %v, want ErrNotFound", err)
	}
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
	if cur.ID != old.ID || cur.Data["container_id"] == old.Data["container_id"] {
		t.Fatalf("second Start = %+v, first %+v: want the same name and a new container", cur, old)
	}
	if containerExists(t, old.Data["container_id"]) {
		t.Errorf("the stopped container %s still exists", old.Data["container_id"])
	}
	if err := b.Destroy(ctxT(t), old); err != nil {
		t.Fatalf("Destroy(old handle): %v", err)
	}
	if !containerExists(t, cur.Data["container_id"]) {
		t.Fatal("Destroy of the old handle removed the new container")
	}
	if _, err := os.Stat(filepath.Join(state, cur.ID, "secrets", "token")); err != nil {
		t.Fatalf("Destroy of the old handle removed the new container's secrets: %v", err)
	}
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
	if err := os.MkdirAll(filepath.Join(state, orphan, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}
	all, err := b.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].ID != h.ID || all[1].ID != orphan || all[1].Task != 46 || all[1].Epoch != 1 || all[1].Data != nil {
		t.Fatalf("List = %+v, want %s and the orphan %s (task 46, no data)", all, h.ID, orphan)
	}
	if err := b.Destroy(ctxT(t), all[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, orphan)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("orphan directory after Destroy: %v", err)
	}
	theirs, err := other.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(theirs) != 0 {
		t.Errorf("another scope lists %+v", theirs)
	}
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
	if code, err := engineJSON(ctxT(t), http.MethodPost, "/containers/create?name="+name, body, &created); err != nil || code != http.StatusCreated {
		t.Fatalf("create %s: %d, %v", name, code, err)
	}
	t.Cleanup(func() {
		_, _ = engineJSON(context.Background(), http.MethodDelete, "/containers/"+created.ID+"?force=1", nil, nil)
	})
	if _, err := b.Start(ctxT(t), fakeSpec(47, "forever")); !errors.Is(err, docker.ErrNotManaged) {
		t.Errorf("Start over a foreign container = %v, want ErrNotManaged", err)
	}
	h := podworker.Handle{Backend: "docker", ID: name, Task: 47, Epoch: 1}
	if err := b.Destroy(ctxT(t), h); !errors.Is(err, docker.ErrNotManaged) {
		t.Errorf("Destroy of a foreign container = %v, want ErrNotManaged", err)
	}
	if !containerExists(t, created.ID) {
		t.Error("the foreign container was removed")
	}
}

func TestCheck(t *testing.T) {
	image := testImage(t)
	b := newBackend(t, image, t.TempDir(), testScope(t), nil)
	if err := b.Check(ctxT(t)); err != nil {
		t.Errorf("Check with the test image: %v", err)
	}
	missing := newBackend(t, "sha256:"+strings.Repeat("0", 64), t.TempDir(), testScope(t), nil)
	if err := missing.Check(ctxT(t)); !errors.Is(err, docker.ErrImageMissing) {
		t.Errorf("Check with a missing image = %v, want ErrImageMissing", err)
	}
	broken := newBackend(t, image, t.TempDir(), testScope(t), func(c *docker.Config) { c.Socket = filepath.Join(t.TempDir(), "no.sock") })
	if err := broken.Check(ctxT(t)); err == nil {
		t.Error("Check against a missing socket succeeded")
	}
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
			if _, err := docker.New(cfg); !errors.Is(err, docker.ErrInvalidConfig) {
				t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
			}
		})
	}
	for _, img := range []string{image, "registry.example/dynrunner/executor@sha256:" + strings.Repeat("0", 64),
		"localhost:5000/executor:v1@sha256:" + strings.Repeat("0", 64)} {
		cfg := ok
		cfg.Image = img
		if _, err := docker.New(cfg); err != nil {
			t.Errorf("New with image %s: %v", img, err)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory: %v, %v; want mode 0700", fi, err)
	}
}

func TestRejectsBadHandles(t *testing.T) {
	b, err := docker.New(docker.Config{Image: "sha256:" + strings.Repeat("ab", 32), StateDir: t.TempDir(), User: testUser()})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []podworker.Handle{
		{Backend: "local", ID: "dynrunner-1-1"},
		{Backend: "docker", ID: "../etc"},
		{Backend: "docker", ID: ""},
		{Backend: "docker", ID: "dynrunner-1-1", Data: map[string]string{"container_id": "abc"}},
	} {
		if err := b.Destroy(t.Context(), h); !errors.Is(err, docker.ErrInvalidHandle) {
			t.Errorf("Destroy(%+v) = %v, want ErrInvalidHandle", h, err)
		}
		if _, err := b.Wait(t.Context(), h); !errors.Is(err, docker.ErrInvalidHandle) {
			t.Errorf("Wait(%+v) = %v, want ErrInvalidHandle", h, err)
		}
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
