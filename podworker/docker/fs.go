package docker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/dynrunner/dynrunner/internal/envlock"
)

// lockEnv takes the exclusive lock of environment name (see envlock.Lock).
func (b *Backend) lockEnv(ctx context.Context, name string) (unlock func(remove bool), err error) {
	return envlock.Lock(ctx, filepath.Join(b.stateDir, locksDir), name)
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
