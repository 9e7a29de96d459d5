package local_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/podworker/local"
)

// TestOpenStateDir: the state directory becomes 0711, its envs stays as it is, and the other
// entries lose every access of other users.
func TestOpenStateDir(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "envs"), 0o711))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nats.password"), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes"), []byte("x"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "jetstream"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(dir, "jetstream"), 0o755))
	require.NoError(t, local.OpenStateDir(dir, zerolog.Nop()))
	for name, want := range map[string]os.FileMode{
		".": 0o711, "envs": 0o711, "nats.password": 0o600, "notes": 0o640, "jetstream": 0o750,
	} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, want, fi.Mode().Perm(), name)
	}
}
