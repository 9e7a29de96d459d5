package launcher

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deadInstance lays out what a SIGKILLed launcher leaves: an instance directory whose
// launcher.pid nobody locks, with a disk and a lease.
func deadInstance(t *testing.T, root string, id InstanceID, ip string) string {
	t.Helper()
	dir := filepath.Join(root, id.String())
	require.NoError(t, os.MkdirAll(dir, 0o700))
	for _, f := range []string{pidFile, diskFile, seedFile, serialFile} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(root, leasesDir), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(root, leasesDir, ip), []byte(id.String()+"\n"), 0o600))
	return dir
}

func mustID(t *testing.T, s string) InstanceID {
	t.Helper()
	id, err := ParseInstanceID(s)
	require.NoError(t, err)
	return id
}

func TestSweep(t *testing.T) {
	root := t.TempDir()
	ctx := context.Background()
	dead := mustID(t, "11111111-1111-4111-8111-111111111111")
	live := mustID(t, "22222222-2222-4222-8222-222222222222")
	gone := mustID(t, "33333333-3333-4333-8333-333333333333")
	deadDir := deadInstance(t, root, dead, "10.213.0.11")
	liveDir := deadInstance(t, root, live, "10.213.0.12")
	// A live launcher holds the lock of its launcher.pid.
	lock, err := os.OpenFile(filepath.Join(liveDir, pidFile), os.O_RDWR, 0)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, flock(lock, syscall.LOCK_EX|syscall.LOCK_NB))
	// A lease whose instance directory is gone.
	require.NoError(t, os.WriteFile(filepath.Join(root, leasesDir, "10.213.0.13"), []byte(gone.String()+"\n"), 0o600))
	// A staging directory of a launcher killed before the rename, and a fresh one without its
	// lock file yet (a launcher between mkdir and open).
	stale := filepath.Join(root, stagingPrefix+dead.String()+"-aaaaaaaaaaaa")
	fresh := filepath.Join(root, stagingPrefix+live.String()+"-bbbbbbbbbbbb")
	for _, d := range []string{stale, fresh} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	require.NoError(t, os.WriteFile(filepath.Join(stale, pidFile), nil, 0o600))
	// Something that is not an instance stays.
	require.NoError(t, os.Mkdir(filepath.Join(root, "not-an-instance"), 0o700))
	// A hypervisor that outlived its launcher: comm starts with "qemu", an argument names a
	// file of the dead instance.
	self, err := os.Executable()
	require.NoError(t, err)
	fake := filepath.Join(t.TempDir(), "qemu-fake")
	require.NoError(t, os.Symlink(self, fake))
	straggler := exec.Command(fake, "-drive", "file="+filepath.Join(deadDir, diskFile))
	straggler.Env = []string{childEnvVar + "=hang"}
	require.NoError(t, straggler.Start())
	exited := make(chan error, 1)
	go func() { exited <- straggler.Wait() }()
	t.Cleanup(func() { _ = straggler.Process.Kill() })
	poll(t, 10*time.Second, "the straggler to exec", func() bool { return len(procsWithArgPrefix(deadDir+"/")) == 1 })

	res, err := SweepCount(ctx, root, testLog(t))
	require.NoError(t, err)
	assert.Equal(t, SweepResult{Instances: 1, Leases: 1}, res)
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if assert.ErrorAs(t, err, &ee, "the straggler ended with %v", err) {
			assert.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal(), "the straggler's end")
		}
	case <-time.After(10 * time.Second):
		assert.Fail(t, "the straggler still runs")
	}
	exists := func(p string) bool { _, err := os.Lstat(p); return err == nil }
	for p, want := range map[string]bool{
		deadDir: false,
		filepath.Join(root, leasesDir, "10.213.0.11"): false,
		filepath.Join(root, leasesDir, "10.213.0.13"): false,
		stale:                            false,
		liveDir:                          true,
		filepath.Join(liveDir, diskFile): true,
		filepath.Join(root, leasesDir, "10.213.0.12"): true,
		fresh:                                  true,
		filepath.Join(root, "not-an-instance"): true,
	} {
		assert.Equal(t, want, exists(p), "%s exists", p)
	}
	// Once its launcher is gone, the live instance is swept too.
	_ = lock.Close()
	res, err = SweepCount(ctx, root, testLog(t))
	require.NoError(t, err, "second sweep")
	assert.Equal(t, 1, res.Instances, "second sweep")
	assert.False(t, exists(liveDir), "second sweep")
}

func TestSweepMissingRoot(t *testing.T) {
	require.NoError(t, Sweep(context.Background(), filepath.Join(t.TempDir(), "nope"), testLog(t)))
}

// TestSweepTAP: a TAP device labelled for an instance directory of this root that is gone is
// deleted; one labelled for another root is not.
func TestSweepTAP(t *testing.T) {
	if testing.Short() {
		t.Skip("creates TAP devices; run without -short")
	}
	if os.Geteuid() != 0 {
		skipOrFail(t, "creating TAP devices needs root")
	}
	if _, err := lookPath("ip"); err != nil {
		skipOrFail(t, "ip (iproute2) is missing")
	}
	ctx := context.Background()
	root := t.TempDir()
	ours := mustID(t, "a1b2c3d4-0000-4000-8000-000000000001")
	theirs := mustID(t, "a1b2c3d5-0000-4000-8000-000000000002")
	for _, c := range []struct {
		id    InstanceID
		alias string
	}{
		{ours, tapAliasPrefix + filepath.Join(root, ours.String())},
		{theirs, tapAliasPrefix + filepath.Join("/elsewhere", theirs.String())},
	} {
		tap := TAPName(c.id)
		for _, args := range [][]string{{"tuntap", "add", "dev", tap, "mode", "tap"}, {"link", "set", "dev", tap, "alias", c.alias}} {
			_, err := run(ctx, "ip", args...)
			require.NoError(t, err)
		}
		t.Cleanup(func() { _, _ = run(context.Background(), "ip", "link", "delete", "dev", tap) })
	}
	res, err := SweepCount(ctx, root, testLog(t))
	require.NoError(t, err)
	assert.Equal(t, 1, res.TAPs)
	_, ok := tapAlias(TAPName(ours))
	assert.False(t, ok, "%s remains", TAPName(ours))
	_, ok = tapAlias(TAPName(theirs))
	assert.True(t, ok, "%s, labelled for another root, was deleted", TAPName(theirs))
}
