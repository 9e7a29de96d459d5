package local_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
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

// The attack mode's inputs and output.
const (
	attackReadEnv = "DYNRUNNER_TEST_READ" // paths to read (files) or list (directories), one a line
	attackKillEnv = "DYNRUNNER_TEST_KILL" // a pid to signal
	attackReport  = "attack.json"         // in the work directory
)

// report is what the attack mode found out.
type report struct {
	UID, GID int
	Groups   []int
	// Own is the content of the environment's own capability-token, or the error.
	Own string
	// Read maps each path to the errno reading it gave (0: it was read).
	Read map[string]syscall.Errno
	// Signal is the errno of signal 0 to the pid of attackKillEnv.
	Signal syscall.Errno
}

// attack is a job that tries to read what it should not and to signal another job's executor.
func attack() error {
	r := report{UID: os.Getuid(), GID: os.Getgid(), Read: map[string]syscall.Errno{}}
	var err error
	if r.Groups, err = os.Getgroups(); err != nil {
		return err
	}
	own, err := os.ReadFile(filepath.Join(os.Getenv("DYNRUNNER_SECRETS_DIR"), podworker.TokenFile))
	r.Own = string(own)
	if err != nil {
		r.Own = err.Error()
	}
	for _, p := range strings.Split(os.Getenv(attackReadEnv), "\n") {
		r.Read[p] = errnoOf(readOrList(p))
	}
	pid, err := strconv.Atoi(os.Getenv(attackKillEnv))
	if err != nil {
		return err
	}
	r.Signal = errnoOf(syscall.Kill(pid, 0))
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(os.Getenv("DYNRUNNER_WORK_DIR"), attackReport), b)
}

func readOrList(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		_, err = f.Readdirnames(-1)
		return err
	}
	_, err = f.Read(make([]byte, 1))
	return err
}

// errnoOf is err's errno, 0 for nil and EIO for an error without one.
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &errno):
		return errno
	}
	return syscall.EIO
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("environments under uids of their own need root: run `go test ./podworker/local/` as root (CI does)")
	}
}

// testUsers is a range of uids for this test process alone, recorded in the host's real
// registry, which every controller on the host shares.
func testUsers() *local.Users {
	return &local.Users{First: 2_100_000_000 + uint32(os.Getpid()%10_000)*16, Count: 16}
}

// stateDir returns a STATE_DIR-like directory the environments' users can pass through, with
// a key file and a CA directory in it as the controller keeps them. t.TempDir's parent is
// 0700, so it is opened up as a controller's host would be.
func stateDir(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		require.NoError(t, os.Chmod(d, 0o711))
	}
	state := filepath.Join(base, "state")
	require.NoError(t, os.MkdirAll(filepath.Join(state, "ca"), 0o700))
	require.NoError(t, os.Chmod(state, 0o711))
	for _, f := range []string{"task.key", "ca/key.pem"} {
		require.NoError(t, os.WriteFile(filepath.Join(state, f), []byte("secret"), 0o600))
	}
	return state
}

func newIsolatedBackend(t *testing.T, root string, users *local.Users, grace time.Duration) *local.Backend {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	b, err := local.New(local.Config{
		Root: root, Command: []string{exe}, BaseEnv: baseEnv(), Grace: grace, PollInterval: 20 * time.Millisecond,
		Users: users, Log: zerolog.New(zerolog.NewTestWriter(t)),
	})
	require.NoError(t, err, "New")
	return b
}

// uidOf reads the real uid of a running process.
func uidOf(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			uid, _ := strconv.Atoi(strings.Fields(v)[0])
			return uid
		}
	}
	t.Fatalf("pid %d: no Uid in status", pid)
	return 0
}

// TestIsolatedJobReadsNothingOfOthers plays a job that tries to read the controller's state
// and another running job's secrets, handle and log, and to signal that job's executor: every
// attempt is refused, while its own secret is readable.
func TestIsolatedJobReadsNothingOfOthers(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	root := filepath.Join(state, "envs")
	users := testUsers()
	b := newIsolatedBackend(t, root, users, time.Second)

	victimSpec := fakeSpec(1, 1, "forever")
	victimSpec.Files = map[string][]byte{podworker.TokenFile: []byte("victim's token")}
	victim := startT(t, b, victimSpec)
	victimDir := filepath.Join(root, victim.ID)
	targets := []string{
		filepath.Join(state, "task.key"),
		filepath.Join(state, "ca", "key.pem"),
		filepath.Join(state, "ca"),
		state,
		root,
		filepath.Join(root, ".locks"),
		filepath.Join(root, ".bin"),
		filepath.Join(victimDir, "secrets", podworker.TokenFile),
		filepath.Join(victimDir, "secrets"),
		filepath.Join(victimDir, "work"),
		filepath.Join(victimDir, "home"),
		filepath.Join(victimDir, "handle.json"),
		filepath.Join(victimDir, "executor.log"),
	}
	spec := fakeSpec(2, 1, "attack")
	spec.Env[attackReadEnv] = strings.Join(targets, "\n")
	spec.Env[attackKillEnv] = victim.Data["pid"]
	spec.Files = map[string][]byte{podworker.TokenFile: []byte("own token")}
	attacker := startT(t, b, spec)
	exit := waitT(t, b, attacker, root)
	require.Zero(t, exit.Code, "attacker exit = %+v", exit)
	raw, err := os.ReadFile(filepath.Join(root, attacker.ID, "work", attackReport))
	require.NoError(t, err)
	var got report
	require.NoError(t, json.Unmarshal(raw, &got))

	victimUID, attackerUID := uidOf(t, pidOf(t, victim)), got.UID
	for _, uid := range []int{victimUID, attackerUID} {
		assert.GreaterOrEqual(t, uid, int(users.First), "environment runs as uid %d, outside the range %d+%d", uid, users.First, users.Count)
		assert.Less(t, uid, int(users.First+users.Count), "environment runs as uid %d, outside the range %d+%d", uid, users.First, users.Count)
	}
	assert.NotEqual(t, victimUID, attackerUID, "both environments run as uid %d", victimUID)
	assert.Equal(t, strconv.Itoa(attackerUID), attacker.Data["uid"], "the attacker's handle uid")
	assert.Equal(t, strconv.Itoa(victimUID), victim.Data["uid"], "the victim's handle uid")
	assert.Equal(t, got.UID, got.GID, "attacker's gid, want its uid")
	assert.Empty(t, got.Groups, "attacker's supplementary groups")
	assert.EqualValues(t, "own token", got.Own, "own capability token: %q", got.Own)
	for _, p := range targets {
		errno, ok := got.Read[p]
		if assert.True(t, ok, "read %s: not tried", p) {
			assert.Equal(t, syscall.EACCES, errno, "read %s: %v (errno %d), want EACCES", p, errno, errno)
		}
	}
	assert.Equal(t, syscall.EPERM, got.Signal, "signal the other job's executor: %v (errno %d), want EPERM", got.Signal, got.Signal)
	for p, mode := range map[string]fs.FileMode{
		root:                                fs.ModeDir | 0o711,
		victimDir:                           fs.ModeDir | 0o710,
		filepath.Join(victimDir, "secrets"): fs.ModeDir | 0o700,
		filepath.Join(victimDir, "secrets", podworker.TokenFile): 0o600,
	} {
		fi, err := os.Lstat(p)
		require.NoError(t, err, "%s: %v, %v; want mode %v", p, fi, err, mode)
		assert.Equal(t, mode, fi.Mode(), "%s: %v, %v; want mode %v", p, fi, err, mode)
	}
}

// TestIsolatedDestroyKillsTheUID: a process that left the executor's session and dropped every
// variable of the environment is still the environment's by its uid, and Destroy kills it.
func TestIsolatedDestroyKillsTheUID(t *testing.T) {
	needRoot(t)
	root := filepath.Join(stateDir(t), "envs")
	b := newIsolatedBackend(t, root, testUsers(), time.Second)
	h := startT(t, b, fakeSpec(1, 1, "escape-clean"))
	escaped := childPID(t, root, h)
	require.Equal(t, h.Data["uid"], strconv.Itoa(uidOf(t, escaped)), "the escaped child's uid, want the environment's")
	require.NoError(t, b.Destroy(ctxT(t), h), "Destroy")
	eventually(t, "the escaped child is gone", func() bool { return !alive(t, escaped) })
	assert.True(t, gone(root)(t, h), "something remains")
}

// TestIsolatedUIDsAcrossBackends: a second Backend over the same root (a restarted controller)
// adopts an environment and gives new ones other uids; a destroyed environment's uid is free
// again.
func TestIsolatedUIDsAcrossBackends(t *testing.T) {
	needRoot(t)
	root := filepath.Join(stateDir(t), "envs")
	users := testUsers()
	first := newIsolatedBackend(t, root, users, time.Second)
	a := startT(t, first, fakeSpec(1, 1, "forever"))
	second := newIsolatedBackend(t, root, users, time.Second)
	list, err := second.List(ctxT(t))
	require.NoError(t, err, "List")
	require.Equal(t, []podworker.Handle{a}, list, "List")
	var hs []podworker.Handle
	seen := map[string]bool{a.Data["uid"]: true}
	for task := range assignment.TaskID(3) {
		h := startT(t, second, fakeSpec(task+2, 1, "forever"))
		assert.False(t, seen[h.Data["uid"]], "environment %s got uid %s, already held", h.ID, h.Data["uid"])
		seen[h.Data["uid"]] = true
		hs = append(hs, h)
	}
	require.NoError(t, second.Destroy(ctxT(t), a))
	again := startT(t, first, fakeSpec(9, 1, "forever"))
	assert.Equal(t, a.Data["uid"], again.Data["uid"], "after destroying %s (uid %s) the next environment got uid %s, want the freed one", a.ID, a.Data["uid"], again.Data["uid"])
	for _, h := range append(hs, again) {
		assert.Equal(t, h.Data["uid"], strconv.Itoa(uidOf(t, pidOf(t, h))), "%s runs as the uid its handle names", h.ID)
	}
}

// TestIsolatedRangeExhausted: with every uid of the range held, Start fails with ErrNoFreeUID
// and leaves nothing behind.
func TestIsolatedRangeExhausted(t *testing.T) {
	needRoot(t)
	root := filepath.Join(stateDir(t), "envs")
	users := testUsers()
	users.Count = 1
	b := newIsolatedBackend(t, root, users, time.Second)
	startT(t, b, fakeSpec(1, 1, "forever"))
	h, err := b.Start(ctxT(t), fakeSpec(2, 1, "forever"))
	require.ErrorIs(t, err, local.ErrNoFreeUID, "Start with the range exhausted = %+v", h)
	_, err = os.Lstat(filepath.Join(root, "2-1"))
	assert.ErrorIs(t, err, fs.ErrNotExist, "the refused environment's directory")
}

func TestNewIsolatedRefuses(t *testing.T) {
	needRoot(t)
	exe, _ := os.Executable()
	closed := filepath.Join(t.TempDir(), "closed")
	require.NoError(t, os.Mkdir(closed, 0o700))
	tests := []struct {
		name  string
		root  string
		users local.Users
	}{
		{"root behind a 0700 directory", filepath.Join(closed, "envs"), *testUsers()},
		{"uid 0", filepath.Join(stateDir(t), "envs"), local.Users{First: 0, Count: 2}},
		{"empty range", filepath.Join(stateDir(t), "envs"), local.Users{First: 3_000_000_000}},
		{"past the last uid", filepath.Join(stateDir(t), "envs"), local.Users{First: 4_294_967_290, Count: 10}},
		{"relative registry", filepath.Join(stateDir(t), "envs"), local.Users{First: 2_100_000_000, Count: 1, Registry: "uids"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := local.New(local.Config{Root: tt.root, Command: []string{exe}, Users: &tt.users})
			assert.Error(t, err, "New = %v, want an error", b)
		})
	}
}

// TestConformanceIsolated runs the backend conformance suite with a uid per environment.
func TestConformanceIsolated(t *testing.T) {
	needRoot(t)
	root := filepath.Join(stateDir(t), "envs")
	users := testUsers()
	podworkertest.RunConformance(t, podworkertest.Harness{
		New: func(t *testing.T) podworker.Backend { return newIsolatedBackend(t, root, users, 5*time.Second) },
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
