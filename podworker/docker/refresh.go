package docker

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/podworker"
)

var _ podworker.Refresher = (*Backend)(nil)

// Refresh replaces secret files of a running environment (its SVID, renewed with the lease)
// in its secrets directory on the host, each atomically; the container sees them through its
// read-only bind mount, and the executor reloads them at its next TLS handshake.
func (b *Backend) Refresh(_ context.Context, h podworker.Handle, files map[string][]byte) error {
	if _, err := b.checkHandle(h); err != nil {
		return err
	}
	for name := range files {
		if !validName(name) {
			return fmt.Errorf("docker: refresh %s: %w: secret file name %q", h.ID, ErrInvalidSpec, name)
		}
	}
	if err := secretfile.ReplaceIn(filepath.Join(b.stateDir, h.ID), secretsSub, files, b.uid, b.gid); err != nil {
		return fmt.Errorf("docker: refresh %s: %w", h.ID, err)
	}
	return nil
}
