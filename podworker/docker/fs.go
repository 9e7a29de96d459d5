package docker

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

// lockEnv takes the exclusive flock(2) of environment name, polling until ctx is done. flock
// locks belong to an open file description, so the lock excludes other goroutines of this
// process as well as other processes sharing StateDir. The returned unlock releases it; with
// remove set it first deletes the lock file. A lock taken on a file that its holder deleted
// meanwhile is dropped and taken again.
func (b *Backend) lockEnv(ctx context.Context, name string) (unlock func(remove bool), err error) {
	p := filepath.Join(b.stateDir, locksDir, name)
	backoff := time.Millisecond
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if errors.Is(err, fs.ErrNotExist) {
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

// writeSecrets creates <StateDir>/<name>/secrets (0700) with files (0600), all owned by the
// container's user, and returns the secrets directory. The caller removes the environment
// directory on error.
func (b *Backend) writeSecrets(name string, files map[string][]byte) (string, error) {
	dir := filepath.Join(b.stateDir, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	sdir := filepath.Join(dir, secretsSub)
	if err := os.Mkdir(sdir, 0o700); err != nil {
		return "", err
	}
	if err := b.chown(sdir); err != nil {
		return "", err
	}
	for fname, data := range files {
		if err := b.writeSecret(filepath.Join(sdir, fname), data); err != nil {
			return "", fmt.Errorf("secret %q: %w", fname, err)
		}
	}
	return sdir, nil
}

func (b *Backend) writeSecret(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	err = f.Chmod(0o600) // exact, whatever the umask
	if err == nil && os.Geteuid() == 0 {
		err = f.Chown(b.uid, b.gid)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// chown gives p to the container's user. Only root can; New made sure that a controller that
// is not root runs containers as its own uid.
func (b *Backend) chown(p string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return os.Lchown(p, b.uid, b.gid)
}

// removeEnvDir removes entry name of StateDir and everything below it, without following
// symbolic links. It reports whether there was anything to remove.
func (b *Backend) removeEnvDir(name string) (bool, error) {
	root, err := os.OpenRoot(b.stateDir)
	if err != nil {
		return false, err
	}
	defer root.Close()
	if _, err := root.Lstat(name); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return true, root.RemoveAll(name)
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
