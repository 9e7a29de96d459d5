package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/podworker"
)

var _ podworker.Refresher = (*Backend)(nil)

// Refresh replaces secret files of a running environment (its SVID, renewed with the lease)
// in its secrets directory, each atomically, owned like the directory. The executor reloads
// them at its next TLS handshake.
func (b *Backend) Refresh(_ context.Context, h podworker.Handle, files map[string][]byte) error {
	id, err := b.checkHandle(h)
	if err != nil {
		return err
	}
	dir := b.dir(id)
	fi, err := os.Lstat(filepath.Join(dir, secretsDir))
	if err != nil {
		return fmt.Errorf("local: refresh %s: %w", id, err)
	}
	uid, gid := -1, -1
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		uid, gid = int(st.Uid), int(st.Gid)
	}
	if err := secretfile.ReplaceIn(dir, secretsDir, files, uid, gid); err != nil {
		return fmt.Errorf("local: refresh %s: %w", id, err)
	}
	return nil
}
