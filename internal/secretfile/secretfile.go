package secretfile

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// MaxSize is the largest credential file Read accepts.
const MaxSize = 1 << 20

var (
	// ErrNotRegular reports a path that is not a regular file (after following links).
	ErrNotRegular = errors.New("not a regular file")
	// ErrPermissions reports a file that other users may read or write.
	ErrPermissions = errors.New("file is accessible by other users")
	// ErrEmpty reports a file that holds nothing but line endings.
	ErrEmpty = errors.New("file is empty")
	// ErrTooShort reports a secret shorter than ReadMin's minimum.
	ErrTooShort = errors.New("secret is too short")
	// ErrTooLarge reports a file larger than MaxSize.
	ErrTooLarge = errors.New("file is too large")
)

// Read reads the credential file at path. See the package documentation for the checks.
// A missing file is reported with an error that matches fs.ErrNotExist.
func Read(path string) ([]byte, error) {
	// Stat before open: opening a FIFO or a device could block or have side effects.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("secretfile: %w", err)
	}
	if err := check(path, fi); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("secretfile: %w", err)
	}
	defer f.Close()
	// Check again on the open descriptor: the path may have been replaced in between.
	fi, err = f.Stat()
	if err != nil {
		return nil, fmt.Errorf("secretfile: %w", err)
	}
	if err := check(path, fi); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("secretfile: read %s: %w", path, err)
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("secretfile: %s is larger than %d bytes: %w", path, MaxSize, ErrTooLarge)
	}
	data = bytes.TrimRight(data, "\r\n")
	if len(data) == 0 {
		return nil, fmt.Errorf("secretfile: %s: %w", path, ErrEmpty)
	}
	return data, nil
}

// ReadMin reads the credential file at path like Read and refuses a secret shorter than minLen
// bytes (after trimming line endings) with ErrTooShort.
func ReadMin(path string, minLen int) ([]byte, error) {
	data, err := Read(path)
	if err != nil {
		return nil, err
	}
	if len(data) < minLen {
		n := len(data)
		clear(data)
		return nil, fmt.Errorf("secretfile: %s holds %d bytes, at least %d are required: %w", path, n, minLen, ErrTooShort)
	}
	return data, nil
}

func check(path string, fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("secretfile: %s (%s): %w", path, fi.Mode().Type(), ErrNotRegular)
	}
	if perm := fi.Mode().Perm(); perm&0o007 != 0 {
		return fmt.Errorf("secretfile: %s has mode %04o; run chmod 600 %s: %w", path, perm, path, ErrPermissions)
	}
	return nil
}

// WriteNew replaces the file at path with data, atomically: data goes to a temporary file
// with mode 0600 in the same directory, is synced, and is renamed over path, so readers see
// either the old or the new content, never a part. The parent directory is created with
// mode 0700 if it does not exist.
func WriteNew(path string, data []byte) error {
	tmp, err := writeTemp(path, data)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("secretfile: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

// createNew writes data to path like WriteNew, but fails with an error matching
// fs.ErrExist if path already exists, so two processes never overwrite each other.
func createNew(path string, data []byte) error {
	tmp, err := writeTemp(path, data)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		return fmt.Errorf("secretfile: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

func writeTemp(path string, data []byte) (string, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("secretfile: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("secretfile: %w", err)
	}
	name := f.Name()
	fail := func(err error) (string, error) {
		_ = f.Close()
		_ = os.Remove(name)
		return "", fmt.Errorf("secretfile: write %s: %w", path, err)
	}
	// CreateTemp uses 0600 already; Chmod makes it explicit and independent of that.
	if err := f.Chmod(0o600); err != nil {
		return fail(err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(name)
		return "", fmt.Errorf("secretfile: write %s: %w", path, err)
	}
	return name, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("secretfile: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("secretfile: sync %s: %w", dir, err)
	}
	return nil
}

// LoadOrCreate returns the secret kept at path. If the file exists it is read with Read
// (and so checked the same way). Otherwise n random bytes are generated, encoded as
// unpadded base64url text and written to path with mode 0600; created is then true. The
// returned secret is that text (without the line ending stored after it). If another
// process creates the file at the same time, both return the same secret.
func LoadOrCreate(path string, n int) (secret []byte, created bool, err error) {
	if n <= 0 {
		return nil, false, fmt.Errorf("secretfile: create %s: invalid length %d", path, n)
	}
	secret, err = Read(path)
	if err == nil {
		return secret, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	raw := make([]byte, n)
	_, _ = rand.Read(raw) // crypto/rand.Read never fails.
	text := base64.RawURLEncoding.AppendEncode(nil, raw)
	clear(raw)
	err = createNew(path, append(text, '\n'))
	if errors.Is(err, fs.ErrExist) {
		clear(text)
		secret, err = Read(path)
		if err != nil {
			return nil, false, err
		}
		return secret, false, nil
	}
	if err != nil {
		clear(text)
		return nil, false, err
	}
	return text[:len(text):len(text)], true, nil
}

// ReplaceIn replaces files in the directory sub of dir while a reader may be using them: each
// is written to a temporary file with mode 0600 (owned by uid:gid when the process is root
// and uid >= 0), synced and renamed over its name, so a reader sees the old or the new
// content, never a part. Nothing is followed out of dir: a symbolic link under it leading
// outside fails. File names must not contain a separator.
func ReplaceIn(dir, sub string, files map[string][]byte, uid, gid int) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("secretfile: %w", err)
	}
	defer root.Close()
	sr, err := root.OpenRoot(sub)
	if err != nil {
		return fmt.Errorf("secretfile: %w", err)
	}
	defer sr.Close()
	var b [8]byte
	for name, data := range files {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return fmt.Errorf("secretfile: file name %q", name)
		}
		_, _ = rand.Read(b[:])
		tmp := "." + name + ".tmp-" + hex.EncodeToString(b[:])
		if err := writeIn(sr, tmp, data, uid, gid); err != nil {
			_ = sr.Remove(tmp)
			return fmt.Errorf("secretfile: write %s: %w", name, err)
		}
		if err := sr.Rename(tmp, name); err != nil {
			_ = sr.Remove(tmp)
			return fmt.Errorf("secretfile: %w", err)
		}
	}
	return syncDir(filepath.Join(dir, sub))
}

func writeIn(r *os.Root, name string, data []byte, uid, gid int) error {
	f, err := r.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Chmod(0o600)
	if err == nil && uid >= 0 && os.Geteuid() == 0 {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
