package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockEnv takes the exclusive flock(2) of environment id, polling until ctx is done. flock locks
// belong to an open file description, so the lock excludes other goroutines of this process as
// well as other processes. The returned unlock releases it; with remove set it first deletes the
// lock file. Because a lock file may be deleted by its holder, a lock taken on a file that is no
// longer at its path is dropped and taken again.
func (b *Backend) lockEnv(ctx context.Context, id string) (unlock func(remove bool), err error) {
	p := filepath.Join(b.root, locksDir, id)
	backoff := time.Millisecond
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if errors.Is(err, fs.ErrNotExist) {
			// Someone removed the locks directory; recreate it.
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				return nil, err
			}
			f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		}
		if err != nil {
			return nil, err
		}
		for {
			err = flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
			if !errors.Is(err, syscall.EWOULDBLOCK) {
				break
			}
			if werr := sleepCtx(ctx, backoff); werr != nil {
				_ = f.Close()
				return nil, werr
			}
			backoff = min(2*backoff, 100*time.Millisecond)
		}
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		held, err1 := f.Stat()
		now, err2 := os.Lstat(p)
		if err1 == nil && err2 == nil && os.SameFile(held, now) {
			return func(remove bool) {
				if remove {
					_ = os.Remove(p)
				}
				_ = f.Close() // releases the lock
			}, nil
		}
		_ = f.Close()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

func flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = syscall.Flock(int(fd), how) }); err != nil {
		return err
	}
	return ferr
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
