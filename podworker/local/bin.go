package local

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// binDir holds, under the root, the copies of the executables that environments run under
// their own uids.
const binDir = ".bin"

// keepOldCopies is how long a copy no Backend made at its start is kept: an environment
// adopted after an upgrade may still start it.
const keepOldCopies = 24 * time.Hour

// shareExecutables copies each of paths to root/.bin (mode 0711, root's), where the
// environments' users can run it, and returns the copies' paths by original path. A copy is
// named after its content, mode 0555 and root's: Backends sharing a root reuse it, and a copy
// an environment runs is never rewritten. Copies that none of paths made, older than a day,
// are removed.
func shareExecutables(root string, paths []string) (map[string]string, error) {
	dir := filepath.Join(root, binDir)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(paths))
	for _, p := range paths {
		if _, ok := out[p]; ok {
			continue
		}
		c, err := shareExecutable(dir, p)
		if err != nil {
			return nil, fmt.Errorf("make %s executable for the environments' users: %w", p, err)
		}
		out[p] = c
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	current := make(map[string]bool, len(out))
	for _, c := range out {
		current[filepath.Base(c)] = true
	}
	for _, e := range entries {
		if current[e.Name()] {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > keepOldCopies {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

func shareExecutable(dir, p string) (string, error) {
	src, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", errors.New("not a regular file")
	}
	tmp, err := os.CreateTemp(dir, ".copy-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(tmp, h), src)
	err = errors.Join(err, tmp.Chmod(0o555), tmp.Sync(), tmp.Close())
	if err != nil {
		return "", err
	}
	// The name first: it is what ps shows of the process.
	name := strings.TrimPrefix(filepath.Base(p), ".") + "-" + hex.EncodeToString(h.Sum(nil))[:16]
	c := filepath.Join(dir, name)
	if fi, err := os.Lstat(c); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0o555 {
		now := time.Now()
		_ = os.Chtimes(c, now, now) // in use again: not to be pruned
		return c, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err := os.Rename(tmp.Name(), c); err != nil {
		return "", err
	}
	return c, syncDir(dir)
}
