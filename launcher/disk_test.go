package launcher

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestDirectIOError(t *testing.T) {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Type != 0x01021994 {
		t.Skip("no tmpfs at /dev/shm")
	}
	err := directIOError("/dev/shm", syscall.EINVAL)
	if !errors.Is(err, ErrNoDirectIO) {
		t.Fatalf("directIOError(EINVAL) = %v, want ErrNoDirectIO", err)
	}
	for _, want := range []string{"/dev/shm is on tmpfs", "--root", "ext4"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if err := directIOError("/x", syscall.EACCES); errors.Is(err, ErrNoDirectIO) || !errors.Is(err, syscall.EACCES) {
		t.Errorf("directIOError(EACCES) = %v", err)
	}
}

// TestProbeDirectIOTmpfs probes a real tmpfs. tmpfs refuses O_DIRECT before Linux 6.6 and
// takes it since; either way the probe leaves nothing behind.
func TestProbeDirectIOTmpfs(t *testing.T) {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Type != 0x01021994 {
		t.Skip("no tmpfs at /dev/shm to probe")
	}
	dir, err := os.MkdirTemp("/dev/shm", "launcher-probe-")
	if err != nil {
		t.Skipf("cannot write to /dev/shm: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	err = probeDirectIO(dir)
	if err != nil && !errors.Is(err, ErrNoDirectIO) {
		t.Fatalf("probeDirectIO on tmpfs = %v", err)
	}
	t.Logf("tmpfs O_DIRECT probe: %v", err)
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("probe left %v", entries)
	}
}

func TestConvertDisk(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		skipOrFail(t, "qemu-img is missing")
	}
	dir := directIODir(t)
	if err := probeDirectIO(dir); err != nil {
		t.Skipf("the test directory refuses O_DIRECT: %v", err)
	}
	ctx := context.Background()
	raw := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(raw, []byte(strings.Repeat("dynrunner", 1<<16)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(raw, 64<<20); err != nil {
		t.Fatal(err)
	}
	qcow := filepath.Join(dir, "base.qcow2")
	if out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	backed := filepath.Join(dir, "backed.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", qcow, backed).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, src := range []string{raw, qcow} {
		t.Run(filepath.Base(src), func(t *testing.T) {
			dst := filepath.Join(dir, filepath.Base(src)+".out.qcow2")
			if err := convertDisk(ctx, src, dst, 1); err != nil {
				t.Fatal(err)
			}
			info, err := inspectImage(ctx, dst)
			if err != nil {
				t.Fatal(err)
			}
			if info.Format != "qcow2" || info.VirtualSize != 1<<30 || info.BackingFilename != "" {
				t.Errorf("converted disk: %+v", info)
			}
			out, err := exec.Command("qemu-img", "compare", "-q", src, dst).CombinedOutput()
			if err != nil {
				t.Errorf("qemu-img compare: %v %s", err, out)
			}
		})
	}
	t.Run("backing file refused", func(t *testing.T) {
		err := convertDisk(ctx, backed, filepath.Join(dir, "x.qcow2"), 1)
		if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("convertDisk = %v, want ErrInvalidConfig", err)
		}
	})
	t.Run("larger than --disk-gib refused", func(t *testing.T) {
		big := filepath.Join(dir, "big.raw")
		if err := os.WriteFile(big, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(big, 2<<30); err != nil {
			t.Fatal(err)
		}
		if err := convertDisk(ctx, big, filepath.Join(dir, "y.qcow2"), 1); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("convertDisk = %v, want ErrInvalidConfig", err)
		}
	})
}
