package launcher

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDirectIOError(t *testing.T) {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Type != 0x01021994 {
		t.Skip("no tmpfs at /dev/shm")
	}
	err := directIOError("/dev/shm", syscall.EINVAL)
	require.ErrorIs(t, err, ErrNoDirectIO)
	for _, want := range []string{"/dev/shm is on tmpfs", "--root", "ext4"} {
		assert.ErrorContains(t, err, want)
	}
	err = directIOError("/x", syscall.EACCES)
	assert.NotErrorIs(t, err, ErrNoDirectIO)
	assert.ErrorIs(t, err, syscall.EACCES)
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
	if err != nil {
		require.ErrorIs(t, err, ErrNoDirectIO, "probeDirectIO on tmpfs")
	}
	t.Logf("tmpfs O_DIRECT probe: %v", err)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "the probe left files")
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
	require.NoError(t, os.WriteFile(raw, []byte(strings.Repeat("dynrunner", 1<<16)), 0o600))
	require.NoError(t, os.Truncate(raw, 64<<20))
	qcow := filepath.Join(dir, "base.qcow2")
	out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow).CombinedOutput()
	require.NoError(t, err, "%s", out)
	backed := filepath.Join(dir, "backed.qcow2")
	out, err = exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", qcow, backed).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, src := range []string{raw, qcow} {
		t.Run(filepath.Base(src), func(t *testing.T) {
			dst := filepath.Join(dir, filepath.Base(src)+".out.qcow2")
			require.NoError(t, convertDisk(ctx, src, dst, 1))
			info, err := inspectImage(ctx, dst)
			require.NoError(t, err)
			assert.Equal(t, "qcow2", info.Format)
			assert.Equal(t, int64(1<<30), info.VirtualSize)
			assert.Empty(t, info.BackingFilename)
			out, err := exec.Command("qemu-img", "compare", "-q", src, dst).CombinedOutput()
			assert.NoError(t, err, "qemu-img compare: %s", out)
		})
	}
	t.Run("backing file refused", func(t *testing.T) {
		err := convertDisk(ctx, backed, filepath.Join(dir, "x.qcow2"), 1)
		assert.ErrorIs(t, err, ErrInvalidConfig)
	})
	t.Run("larger than --disk-gib refused", func(t *testing.T) {
		big := filepath.Join(dir, "big.raw")
		require.NoError(t, os.WriteFile(big, nil, 0o600))
		require.NoError(t, os.Truncate(big, 2<<30))
		err := convertDisk(ctx, big, filepath.Join(dir, "y.qcow2"), 1)
		assert.ErrorIs(t, err, ErrInvalidConfig)
	})
}
