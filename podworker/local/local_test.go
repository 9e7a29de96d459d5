package local_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/local"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

const testTimeout = 30 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newBackend returns a Backend over root whose executor is this test binary.
func newBackend(t *testing.T, root string, grace time.Duration) *local.Backend {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	b, err := local.New(local.Config{
		Root:         root,
		Command:      []string{exe},
		BaseEnv:      baseEnv(),
		Grace:        grace,
		PollInterval: 20 * time.Millisecond,
		Log:          zerolog.New(zerolog.NewTestWriter(t)),
	})
	require.NoError(t, err, "New")
	return b
}

func TestConformance(t *testing.T) {
	root := t.TempDir()
	podworkertest.RunConformance(t, podworkertest.Harness{
		New: func(t *testing.T) podworker.Backend { return newBackend(t, root, 5*time.Second) },
		Spec: func(t *testing.T, task assignment.TaskID, behavior podworkertest.Behavior) podworker.Spec {
			mode, ok := modes[behavior]
			require.True(t, ok, "no fake executor mode for %v", behavior)
			return fakeSpec(task, 0, mode)
		},
		Gone:           gone(root),
		KnownExitCodes: true,
		Without:        map[string]string{podworkertest.CheckNeverReady: "Start returns once the executor process runs; an executor that never gets going is the worker's pickup timeout, not the backend's"},
		Timeout:        testTimeout,
	})
}

// proc is a running (not zombie) process as the tests see it.
type proc struct {
	pid, pgrp int
	envDir    string // its DYNRUNNER_ENV_DIR
}

// running lists the running processes, read independently of the package under test.
func running(t *testing.T) []proc {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if f[0] == "Z" || f[0] == "X" {
			continue
		}
		p := proc{pid: pid}
		p.pgrp, _ = strconv.Atoi(f[2])
		environ, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		for kv := range strings.SplitSeq(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, "DYNRUNNER_ENV_DIR="); ok {
				p.envDir = v
			}
		}
		out = append(out, p)
	}
	return out
}

func alive(t *testing.T, pid int) bool {
	t.Helper()
	for _, p := range running(t) {
		if p.pid == pid {
			return true
		}
	}
	return false
}

// gone reports whether the environment's directory is gone and none of its processes runs.
func gone(root string) func(t *testing.T, h podworker.Handle) bool {
	return func(t *testing.T, h podworker.Handle) bool {
		dir := filepath.Join(root, h.ID)
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		pgid, _ := strconv.Atoi(h.Data["pgid"])
		for _, p := range running(t) {
			if (pgid > 0 && p.pgrp == pgid) || p.envDir == dir {
				t.Logf("pid %d (pgid %d, env %s) still runs", p.pid, p.pgrp, p.envDir)
				return false
			}
		}
		return true
	}
}

// eventually polls cond until it is true, failing t after testTimeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for pause := 5 * time.Millisecond; !cond(); pause = min(2*pause, 200*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", testTimeout, what)
		}
		time.Sleep(pause)
	}
}

func pidOf(t *testing.T, h podworker.Handle) int {
	t.Helper()
	pid, err := strconv.Atoi(h.Data["pid"])
	require.NoError(t, err, "handle %+v: pid", h)
	return pid
}

// startT starts spec and destroys it at cleanup.
func startT(t *testing.T, b *local.Backend, spec podworker.Spec) podworker.Handle {
	t.Helper()
	h, err := b.Start(ctxT(t), spec)
	require.NoError(t, err, "Start")
	t.Cleanup(func() {
		assert.NoError(t, b.Destroy(context.Background(), h), "cleanup: Destroy")
	})
	return h
}

func waitT(t *testing.T, b *local.Backend, h podworker.Handle, root string) podworker.Exit {
	t.Helper()
	exit, err := b.Wait(ctxT(t), h)
	require.NoError(t, err, "Wait")
	if exit.Code != 0 && root != "" {
		log, _ := os.ReadFile(filepath.Join(root, h.ID, "executor.log"))
		t.Logf("executor.log:\n%s", log)
	}
	return exit
}

func TestNewValidates(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	tests := []struct {
		name string
		cfg  local.Config
	}{
		{"relative root", local.Config{Root: "envs", Command: []string{exe}}},
		{"empty root", local.Config{Command: []string{exe}}},
		{"no command", local.Config{Root: t.TempDir()}},
		{"empty executable", local.Config{Root: t.TempDir(), Command: []string{""}}},
		{"missing executable", local.Config{Root: t.TempDir(), Command: []string{"/nonexistent/dynrunner"}}},
		{"not executable", local.Config{Root: t.TempDir(), Command: []string{"/etc/passwd"}}},
		{"directory", local.Config{Root: t.TempDir(), Command: []string{"/"}}},
		{"bad base env", local.Config{Root: t.TempDir(), Command: []string{exe}, BaseEnv: []string{"NOEQUALS"}}},
		{"negative grace", local.Config{Root: t.TempDir(), Command: []string{exe}, Grace: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := local.New(tt.cfg)
			assert.Error(t, err, "New(%+v) = %v, want an error", tt.cfg, b)
		})
	}
	root := filepath.Join(t.TempDir(), "state", "envs")
	_, err = local.New(local.Config{Root: root, Command: []string{"sh", "-c", "true"}})
	assert.NoError(t, err, "New with a PATH command and a missing root")
	if fi, err := os.Stat(root); assert.NoError(t, err, "root") {
		assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "root: want a 0700 directory")
	}
}

func TestStartEnvironment(t *testing.T) {
	t.Setenv("DYNRUNNER_TEST_NOT_INHERITED", "1")
	root := t.TempDir()
	exe, _ := os.Executable()
	b, err := local.New(local.Config{
		Root:    root,
		Command: []string{exe},
		BaseEnv: append(baseEnv(), "FROM_BASE=base", "OVERRIDDEN=by-base"),
		Log:     zerolog.New(zerolog.NewTestWriter(t)),
	})
	require.NoError(t, err)
	spec := fakeSpec(12, 34, "check-env")
	spec.Env["FROM_SPEC"] = "spec"
	spec.Env["OVERRIDDEN"] = "by-spec"
	spec.Env["HOME"] = "/root" // the backend's own variables win
	spec.Files = map[string][]byte{"token": []byte("secret"), "svid.pem": []byte("pem")}
	h := startT(t, b, spec)

	dir := filepath.Join(root, "12-34")
	want := podworker.Handle{
		Backend: "local", ID: "12-34", Task: 12, Epoch: 34,
		Data: map[string]string{"pid": h.Data["pid"], "pgid": h.Data["pid"], "start_time": h.Data["start_time"], "dir": dir},
	}
	assert.Equal(t, want, h, "handle")
	assert.Equal(t, podworker.Exit{Code: 0, Reason: "exited"}, waitT(t, b, h, root), "exit")
	var onDisk podworker.Handle
	if b, err := os.ReadFile(filepath.Join(dir, "handle.json")); assert.NoError(t, err, "handle.json") &&
		assert.NoError(t, json.Unmarshal(b, &onDisk), "handle.json: %s", b) {
		assert.Equal(t, h, onDisk, "handle.json")
	}
	for p, mode := range map[string]fs.FileMode{
		dir:                                    fs.ModeDir | 0o700,
		filepath.Join(dir, "secrets"):          fs.ModeDir | 0o700,
		filepath.Join(dir, "secrets/token"):    0o600,
		filepath.Join(dir, "secrets/svid.pem"): 0o600,
		filepath.Join(dir, "executor.log"):     0o600,
	} {
		if fi, err := os.Lstat(p); assert.NoError(t, err, p) {
			assert.Equal(t, mode, fi.Mode(), "%s: mode", p)
		}
	}
	got, _ := os.ReadFile(filepath.Join(dir, "secrets/token"))
	assert.Equal(t, "secret", string(got), "secrets/token")
}

func TestExecutorLog(t *testing.T) {
	root := t.TempDir()
	b := newBackend(t, root, time.Second)
	h := startT(t, b, fakeSpec(1, 1, "no-such-mode"))
	exit := waitT(t, b, h, "")
	assert.Equal(t, 10, exit.Code, "exit = %+v", exit)
	log, err := os.ReadFile(filepath.Join(root, h.ID, "executor.log"))
	assert.NoError(t, err, "executor.log")
	assert.Contains(t, string(log), "fake executor no-such-mode: unknown mode", "executor.log: want the executor's stderr")
}

func TestDestroyEscalatesToSIGKILL(t *testing.T) {
	const grace = 300 * time.Millisecond
	b := newBackend(t, t.TempDir(), grace)
	h := startT(t, b, fakeSpec(1, 1, "ignore-term"))
	// The executor ignores SIGTERM only once it runs its mode; wait until it does.
	eventually(t, "the executor ignores SIGTERM", func() bool { return ignoresSIGTERM(t, pidOf(t, h)) })
	start := time.Now()
	require.NoError(t, b.Destroy(ctxT(t), h), "Destroy")
	d := time.Since(start)
	assert.GreaterOrEqual(t, d, grace, "Destroy took %v, less than the grace period %v", d, grace)
	assert.False(t, alive(t, pidOf(t, h)), "executor survived Destroy")
}

// ignoresSIGTERM reads the ignored-signals mask of pid.
func ignoresSIGTERM(t *testing.T, pid int) bool {
	t.Helper()
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(uint(syscall.SIGTERM)-1)) != 0
		}
	}
	return false
}

func TestDestroyWithCanceledContextKillsAtOnce(t *testing.T) {
	b := newBackend(t, t.TempDir(), time.Hour)
	h := startT(t, b, fakeSpec(1, 1, "ignore-term"))
	eventually(t, "the executor ignores SIGTERM", func() bool { return ignoresSIGTERM(t, pidOf(t, h)) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, b.Destroy(ctx, h), "Destroy")
	assert.False(t, alive(t, pidOf(t, h)), "executor survived Destroy")
}

// childPID waits for the pid a stray or escape executor records. Should the test fail to
// destroy the child, cleanup kills it.
func childPID(t *testing.T, root string, h podworker.Handle) int {
	t.Helper()
	p := filepath.Join(root, h.ID, "work", childPIDFile)
	var pid int
	eventually(t, "the executor records its child", func() bool {
		b, err := os.ReadFile(p)
		pid, _ = strconv.Atoi(string(b))
		return err == nil && pid > 0
	})
	dir := filepath.Join(root, h.ID)
	t.Cleanup(func() {
		for _, p := range running(t) {
			if p.pid == pid && p.envDir == dir {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return pid
}

func TestDestroyKillsStrays(t *testing.T) {
	root := t.TempDir()
	b := newBackend(t, root, 300*time.Millisecond)
	h := startT(t, b, fakeSpec(1, 1, "stray"))
	exit := waitT(t, b, h, root)
	require.Zero(t, exit.Code, "exit = %+v", exit)
	stray := childPID(t, root, h)
	require.True(t, alive(t, stray), "stray is not running")
	require.NoError(t, b.Destroy(ctxT(t), h), "Destroy")
	assert.False(t, alive(t, stray), "stray survived Destroy")
	assert.True(t, gone(root)(t, h), "something remains")
}

func TestDestroyKillsEscapedProcesses(t *testing.T) {
	root := t.TempDir()
	b := newBackend(t, root, 5*time.Second)
	h := startT(t, b, fakeSpec(1, 1, "escape"))
	escaped := childPID(t, root, h)
	require.NoError(t, b.Destroy(ctxT(t), h), "Destroy")
	assert.False(t, alive(t, escaped), "process in its own session survived Destroy")
}

func TestStartWipesExitedEnvironment(t *testing.T) {
	root := t.TempDir()
	b := newBackend(t, root, 5*time.Second)
	h1 := startT(t, b, fakeSpec(3, 4, "exit0"))
	waitT(t, b, h1, root)
	leftover := filepath.Join(root, h1.ID, "work", "leftover")
	require.NoError(t, os.WriteFile(leftover, nil, 0o600))
	h2 := startT(t, b, fakeSpec(3, 4, "forever"))
	assert.Equal(t, h1.ID, h2.ID, "restart: want the same id")
	assert.NotEqual(t, h1.Data["pid"], h2.Data["pid"], "restart: want a new process")
	_, err := os.Stat(leftover)
	assert.ErrorIs(t, err, fs.ErrNotExist, "leftover of the first run")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = b.Wait(ctx, h2)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "Wait on the restarted environment, want it running")
	// The old handle names a process that is gone, in a directory that now is another's.
	exit, err := b.Wait(ctxT(t), h1)
	assert.NoError(t, err, "Wait(old handle)")
	assert.Equal(t, -1, exit.Code, "Wait(old handle) = %+v", exit)
}

// TestStartAfterCrashBeforeHandle covers a controller that died after it started the executor
// but before it wrote handle.json: a directory without a handle, with a process in it.
func TestStartAfterCrashBeforeHandle(t *testing.T) {
	root := t.TempDir()
	b := newBackend(t, root, 5*time.Second)
	dir := filepath.Join(root, "5-1")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "work"), 0o700))
	exe, _ := os.Executable()
	orphan := exec.Command(exe)
	orphan.Env = append(baseEnv(), fakeEnv+"=forever", "DYNRUNNER_ENV_DIR="+dir)
	orphan.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, orphan.Start())
	orphanDone := make(chan struct{})
	go func() { _ = orphan.Wait(); close(orphanDone) }()
	t.Cleanup(func() { _ = orphan.Process.Kill(); <-orphanDone })
	eventually(t, "the orphan runs", func() bool {
		for _, p := range running(t) {
			if p.pid == orphan.Process.Pid && p.envDir == dir {
				return true
			}
		}
		return false
	})

	list, err := b.List(ctxT(t))
	require.NoError(t, err)
	broken := podworker.Handle{Backend: "local", ID: "5-1", Task: 5, Epoch: 1}
	assert.Equal(t, []podworker.Handle{broken}, list, "List")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = b.Wait(ctx, broken)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "Wait(handle without data), want it running while its process runs")

	h := startT(t, b, fakeSpec(5, 1, "forever"))
	select {
	case <-orphanDone:
	case <-time.After(testTimeout):
		t.Fatal("Start left the orphaned executor running")
	}
	assert.NotEqual(t, strconv.Itoa(orphan.Process.Pid), h.Data["pid"], "Start adopted the orphan")
}

func TestListAndDestroyForeignEntries(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	precious := filepath.Join(outside, "precious")
	require.NoError(t, os.WriteFile(precious, []byte("keep"), 0o400))
	b := newBackend(t, root, time.Second)
	// An environment whose work directory links outside, with a read-only tree.
	h := startT(t, b, fakeSpec(9, 9, "write-files"))
	waitT(t, b, h, root)
	require.NoError(t, os.Symlink(outside, filepath.Join(root, h.ID, "work", "out")))
	// Entries that are not environments.
	require.NoError(t, os.MkdirAll(filepath.Join(root, "junk", "ro", "deeper"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(root, "junk", "ro", "deeper", "f"), nil, 0o400))
	for _, d := range []string{"junk/ro/deeper", "junk/ro"} {
		require.NoError(t, os.Chmod(filepath.Join(root, d), 0o500))
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "file"), nil, 0o600))
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "link")))

	list, err := b.List(ctxT(t))
	require.NoError(t, err)
	want := []podworker.Handle{
		h,
		{Backend: "local", ID: "file"},
		{Backend: "local", ID: "junk"},
		{Backend: "local", ID: "link"},
	}
	assert.Equal(t, want, list, "List")
	for _, l := range list {
		assert.NoError(t, b.Destroy(ctxT(t), l), "Destroy(%s)", l.ID)
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		assert.EqualValues(t, ".locks", e.Name(), "%s remains in root", e.Name())
	}
	got, err := os.ReadFile(precious)
	assert.NoError(t, err, "file outside root")
	assert.Equal(t, "keep", string(got), "file outside root")
}

func TestInvalidHandlesAndSpecs(t *testing.T) {
	b := newBackend(t, t.TempDir(), time.Second)
	handles := []podworker.Handle{
		{Backend: "docker", ID: "1-1", Task: 1, Epoch: 1},
		{Backend: "local", ID: ""},
		{Backend: "local", ID: ".."},
		{Backend: "local", ID: "../1-1"},
		{Backend: "local", ID: ".locks"},
		{Backend: "local", ID: "a/b"},
		{Backend: "local", ID: "1-1", Data: map[string]string{"pid": "100", "pgid": "1", "start_time": "5"}},
		{Backend: "local", ID: "1-1", Data: map[string]string{"pid": "x"}},
	}
	for _, h := range handles {
		assert.ErrorIs(t, b.Destroy(ctxT(t), h), local.ErrInvalidHandle, "Destroy(%+v)", h)
		_, err := b.Wait(ctxT(t), h)
		assert.ErrorIs(t, err, local.ErrInvalidHandle, "Wait(%+v)", h)
	}
	specs := []struct {
		name string
		spec podworker.Spec
	}{
		{"no task", podworker.Spec{Epoch: 1}},
		{"negative task", podworker.Spec{Task: -1, Epoch: 1}},
		{"no epoch", podworker.Spec{Task: 1}},
		{"env key with =", podworker.Spec{Task: 1, Epoch: 1, Env: map[string]string{"A=B": "c"}}},
		{"empty env key", podworker.Spec{Task: 1, Epoch: 1, Env: map[string]string{"": "c"}}},
		{"env value with NUL", podworker.Spec{Task: 1, Epoch: 1, Env: map[string]string{"A": "b\x00c"}}},
		{"secret ..", podworker.Spec{Task: 1, Epoch: 1, Files: map[string][]byte{"..": nil}}},
		{"secret .", podworker.Spec{Task: 1, Epoch: 1, Files: map[string][]byte{".": nil}}},
		{"secret with slash", podworker.Spec{Task: 1, Epoch: 1, Files: map[string][]byte{"a/b": nil}}},
		{"secret with ..", podworker.Spec{Task: 1, Epoch: 1, Files: map[string][]byte{"../../etc/x": nil}}},
		{"empty secret name", podworker.Spec{Task: 1, Epoch: 1, Files: map[string][]byte{"": nil}}},
	}
	for _, tt := range specs {
		t.Run(tt.name, func(t *testing.T) {
			h, err := b.Start(ctxT(t), tt.spec)
			assert.ErrorIs(t, err, local.ErrInvalidSpec, "Start = %+v", h)
		})
	}
}

// TestSurvivesControllerDeath starts an environment from a separate controller process,
// SIGKILLs that process, and checks that the environment still runs and that a new Backend
// adopts and destroys it.
func TestSurvivesControllerDeath(t *testing.T) {
	root := t.TempDir()
	exe, _ := os.Executable()
	ctl := exec.Command(exe)
	ctl.Env = append(baseEnv(), controllerEnv+"="+root)
	var stderr bytes.Buffer
	ctl.Stderr = &stderr
	out, err := ctl.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, ctl.Start())
	ctlDone := make(chan error, 1)
	lines := make(chan []byte, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadBytes('\n')
		lines <- line
		ctlDone <- ctl.Wait()
	}()
	t.Cleanup(func() { _ = ctl.Process.Kill() })
	var h podworker.Handle
	select {
	case line := <-lines:
		// The message reads stderr only on failure: the controller may still be writing it.
		if err := json.Unmarshal(line, &h); err != nil {
			t.Fatalf("controller printed %q (%v); stderr:\n%s", line, err, stderr.String())
		}
	case <-time.After(testTimeout):
		t.Fatal("controller printed no handle")
	}
	require.NoError(t, ctl.Process.Kill())
	require.Error(t, <-ctlDone, "controller exited with 0, want killed")

	require.True(t, alive(t, pidOf(t, h)), "environment died with its controller")
	b := newBackend(t, root, 5*time.Second)
	list, err := b.List(ctxT(t))
	require.NoError(t, err)
	assert.Equal(t, []podworker.Handle{h}, list, "List after the restart")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = b.Wait(ctx, h)
	require.ErrorIs(t, err, context.DeadlineExceeded, "Wait on the adopted environment, want it running")
	waited := make(chan error, 1)
	go func() {
		exit, err := b.Wait(ctxT(t), h)
		if err == nil && exit.Code != -1 {
			err = errors.New("adopted exit code should be unknown")
		}
		waited <- err
	}()
	require.NoError(t, b.Destroy(ctxT(t), h), "Destroy")
	if err := <-waited; !errors.Is(err, podworker.ErrNotFound) {
		assert.NoError(t, err, "Wait during Destroy")
	}
	assert.True(t, gone(root)(t, h), "something remains")
}
