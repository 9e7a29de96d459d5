package launcher

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// deadInstance lays out what a SIGKILLed launcher leaves: an instance directory whose
// launcher.pid nobody locks, with a disk and a lease.
func deadInstance(t *testing.T, root string, id InstanceID, ip string) string {
	t.Helper()
	dir := filepath.Join(root, id.String())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{pidFile, diskFile, seedFile, serialFile} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, leasesDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, leasesDir, ip), []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func mustID(t *testing.T, s string) InstanceID {
	t.Helper()
	id, err := ParseInstanceID(s)
	if err != nil {
		t.Fatal(err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := flock(lock, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	// A lease whose instance directory is gone.
	if err := os.WriteFile(filepath.Join(root, leasesDir, "10.213.0.13"), []byte(gone.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A staging directory of a launcher killed before the rename, and a fresh one without its
	// lock file yet (a launcher between mkdir and open).
	stale := filepath.Join(root, stagingPrefix+dead.String()+"-aaaaaaaaaaaa")
	fresh := filepath.Join(root, stagingPrefix+live.String()+"-bbbbbbbbbbbb")
	for _, d := range []string{stale, fresh} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(stale, pidFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Something that is not an instance stays.
	if err := os.Mkdir(filepath.Join(root, "not-an-instance"), 0o700); err != nil {
		t.Fatal(err)
	}
	// A hypervisor that outlived its launcher: comm starts with "qemu", an argument names a
	// file of the dead instance.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), "qemu-fake")
	if err := os.Symlink(self, fake); err != nil {
		t.Fatal(err)
	}
	straggler := exec.Command(fake, "-drive", "file="+filepath.Join(deadDir, diskFile))
	straggler.Env = []string{childEnvVar + "=hang"}
	if err := straggler.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- straggler.Wait() }()
	t.Cleanup(func() { _ = straggler.Process.Kill() })
	poll(t, 10*time.Second, "the straggler to exec", func() bool { return len(procsWithArgPrefix(deadDir+"/")) == 1 })

	res, err := SweepCount(ctx, root, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := (SweepResult{Instances: 1, Leases: 1}); res != want {
		t.Errorf("SweepCount = %+v, want %+v", res, want)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("straggler ended with %v, want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the straggler still runs")
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
		if got := exists(p); got != want {
			t.Errorf("%s exists: %v, want %v", p, got, want)
		}
	}
	// Once its launcher is gone, the live instance is swept too.
	_ = lock.Close()
	if res, err := SweepCount(ctx, root, testLog(t)); err != nil || res.Instances != 1 || exists(liveDir) {
		t.Errorf("second sweep: %+v, %v", res, err)
	}
}

func TestSweepMissingRoot(t *testing.T) {
	if err := Sweep(context.Background(), filepath.Join(t.TempDir(), "nope"), testLog(t)); err != nil {
		t.Fatal(err)
	}
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
			if _, err := run(ctx, "ip", args...); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { _, _ = run(context.Background(), "ip", "link", "delete", "dev", tap) })
	}
	res, err := SweepCount(ctx, root, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if res.TAPs != 1 {
		t.Errorf("SweepCount = %+v, want 1 TAP", res)
	}
	if _, ok := tapAlias(TAPName(ours)); ok {
		t.Errorf("%s remains", TAPName(ours))
	}
	if _, ok := tapAlias(TAPName(theirs)); !ok {
		t.Errorf("%s, labelled for another root, was deleted", TAPName(theirs))
	}
}
