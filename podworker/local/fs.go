package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/dynrunner/dynrunner/internal/envlock"
)

// lockEnv takes the exclusive lock of environment id (see envlock.Lock).
func (b *Backend) lockEnv(ctx context.Context, id string) (unlock func(remove bool), err error) {
	return envlock.Lock(ctx, filepath.Join(b.root, locksDir), id)
}

// removeEnvDir removes entry id of the directory rootDir and everything below it. It never
// follows a symbolic link: all access goes through an os.Root, and links are removed, not
// entered. Directories are made writable first (Go's module cache and git objects are
// read-only); removing a file needs only its directory to be writable.
// It reports whether there was anything to remove.
func removeEnvDir(rootDir, id string) (bool, error) {
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return false, err
	}
	defer root.Close()
	fi, err := root.Lstat(id)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.IsDir() {
		_ = fs.WalkDir(root.FS(), id, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && d.Type()&fs.ModeSymlink == 0 {
				_ = root.Chmod(p, 0o700)
			}
			return nil // keep going; RemoveAll reports what it cannot remove
		})
	}
	// A controller that reaps the executor may still be writing exit.json while another removes
	// the directory; a second pass picks up such late entries.
	for range 3 {
		if err = root.RemoveAll(id); err == nil {
			return true, nil
		}
	}
	return true, err
}

// sleepCtx waits for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errorf formats a package error: "local: <op> <id>: <err>".
func errorf(op, id string, err error) error {
	return fmt.Errorf("local: %s %s: %w", op, id, err)
}
