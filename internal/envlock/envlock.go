// Package envlock serialises work on one environment across goroutines and processes: an
// exclusive flock(2) on a per-environment lock file. The pod backends use it so that Start and
// Destroy of the same environment, from one controller or from an old and a new one after a
// restart, take turns.
package envlock

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Lock takes the exclusive lock of dir/name, polling until ctx is done. flock locks belong to
// an open file description, so the lock excludes other goroutines of this process as well as
// other processes. The returned unlock releases it; with remove set it first deletes the lock
// file. Because a lock file may be deleted by its holder, a lock taken on a file that is no
// longer at its path is dropped and taken again.
func Lock(ctx context.Context, dir, name string) (unlock func(remove bool), err error) {
	p := filepath.Join(dir, name)
	backoff := time.Millisecond
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if errors.Is(err, fs.ErrNotExist) {
			// Someone removed the locks directory; recreate it.
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, err
			}
			f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		}
		if err != nil {
			return nil, err
		}
		for {
			err = Flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
			if !errors.Is(err, syscall.EWOULDBLOCK) {
				break
			}
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				_ = f.Close()
				return nil, ctx.Err()
			case <-t.C:
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

// Flock applies flock(2) operation how to f, retrying when a signal interrupts it.
func Flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = syscall.Flock(int(fd), how)
			if !errors.Is(ferr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}

// RemoveDir removes entry id of the directory rootDir and everything below it. It never
// follows a symbolic link: all access goes through an os.Root, and links are removed, not
// entered. Directories are made writable first (Go's module cache and git objects are
// read-only); removing a file needs only its directory to be writable.
// It reports whether there was anything to remove. The pod backends remove an environment's
// state directory with it, under the environment's lock.
func RemoveDir(rootDir, id string) (bool, error) {
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
