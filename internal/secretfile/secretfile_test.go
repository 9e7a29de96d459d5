package secretfile

import (
	"bytes"
	"encoding/base64"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const content = "s3cr3t-value-that-must-not-leak"

func writeFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(data), mode))
	// WriteFile is subject to the umask; set the mode exactly.
	require.NoError(t, os.Chmod(path, mode))
}

func TestRead(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string) string
		want    string
		wantErr error
	}{
		{
			name: "plain 0600",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content, 0o600)
				return p
			},
			want: content,
		},
		{
			name: "group readable 0640 is accepted",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content, 0o640)
				return p
			},
			want: content,
		},
		{
			name: "read only 0400",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content, 0o400)
				return p
			},
			want: content,
		},
		{
			name: "trailing newline trimmed",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content+"\n", 0o600)
				return p
			},
			want: content,
		},
		{
			name: "trailing crlf and blank lines trimmed",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content+"\r\n\r\n\n", 0o600)
				return p
			},
			want: content,
		},
		{
			name: "inner newline kept",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, "a\nb\n", 0o600)
				return p
			},
			want: "a\nb",
		},
		{
			name: "spaces kept",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, " a ", 0o600)
				return p
			},
			want: " a ",
		},
		{
			name: "symlink chain like a kubernetes secret mount",
			setup: func(t *testing.T, dir string) string {
				// Kubernetes: key -> ..data/key, ..data -> ..2024_01_01_xxx
				ts := filepath.Join(dir, "..2024_01_01")
				require.NoError(t, os.Mkdir(ts, 0o755))
				writeFile(t, filepath.Join(ts, "token"), content+"\n", 0o600)
				require.NoError(t, os.Symlink("..2024_01_01", filepath.Join(dir, "..data")))
				p := filepath.Join(dir, "token")
				require.NoError(t, os.Symlink(filepath.Join("..data", "token"), p))
				return p
			},
			want: content,
		},
		{
			name: "missing",
			setup: func(t *testing.T, dir string) string {
				return filepath.Join(dir, "nope")
			},
			wantErr: fs.ErrNotExist,
		},
		{
			name: "dangling symlink",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				require.NoError(t, os.Symlink(filepath.Join(dir, "nope"), p))
				return p
			},
			wantErr: fs.ErrNotExist,
		},
		{
			name: "directory",
			setup: func(t *testing.T, dir string) string {
				return dir
			},
			wantErr: ErrNotRegular,
		},
		{
			name: "fifo is refused without blocking",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "fifo")
				if err := syscall.Mkfifo(p, 0o600); err != nil {
					t.Skipf("mkfifo: %v", err)
				}
				return p
			},
			wantErr: ErrNotRegular,
		},
		{
			name: "world readable 0644",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content, 0o644)
				return p
			},
			wantErr: ErrPermissions,
		},
		{
			name: "world writable 0602",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content, 0o602)
				return p
			},
			wantErr: ErrPermissions,
		},
		{
			name: "world executable 0601",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content, 0o601)
				return p
			},
			wantErr: ErrPermissions,
		},
		{
			name: "symlink to world readable file",
			setup: func(t *testing.T, dir string) string {
				target := filepath.Join(dir, "target")
				writeFile(t, target, content, 0o644)
				p := filepath.Join(dir, "s")
				require.NoError(t, os.Symlink(target, p))
				return p
			},
			wantErr: ErrPermissions,
		},
		{
			name: "empty",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, "", 0o600)
				return p
			},
			wantErr: ErrEmpty,
		},
		{
			name: "only line endings",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, "\r\n\n", 0o600)
				return p
			},
			wantErr: ErrEmpty,
		},
		{
			name: "too large",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "s")
				writeFile(t, p, content+strings.Repeat("x", MaxSize), 0o600)
				return p
			},
			wantErr: ErrTooLarge,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.setup(t, t.TempDir())
			got, err := Read(path)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr, "Read()")
				assert.NotContains(t, err.Error(), content, "error leaks the content")
				assert.True(t, strings.HasPrefix(err.Error(), "secretfile: "), "error %q lacks the package prefix", err)
				return
			}
			require.NoError(t, err, "Read()")
			assert.Equal(t, tt.want, string(got), "Read()")
		})
	}
}

func TestReadPermissionMessage(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key")
	writeFile(t, p, content, 0o644)
	_, err := Read(p)
	require.ErrorIs(t, err, ErrPermissions, "Read() error = %v, want ErrPermissions", err)
	// The operator is told what to run.
	assert.ErrorContains(t, err, "chmod 600 "+p, "error does not tell the operator what to run")
}

func TestReadMin(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		min     int
		wantErr error
	}{
		{name: "longer", data: strings.Repeat("k", 40), min: 32},
		{name: "exact", data: strings.Repeat("k", 32) + "\n", min: 32},
		{name: "short", data: strings.Repeat("k", 31), min: 32, wantErr: ErrTooShort},
		{name: "short after trimming", data: strings.Repeat("k", 31) + "\n", min: 32, wantErr: ErrTooShort},
		{name: "empty is empty, not short", data: "\n", min: 32, wantErr: ErrEmpty},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "key")
			writeFile(t, p, tt.data, 0o600)
			got, err := ReadMin(p, tt.min)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr, "ReadMin()")
				if data := strings.TrimSpace(tt.data); data != "" {
					assert.NotContains(t, err.Error(), data, "error leaks the content")
				}
				return
			}
			require.NoError(t, err, "ReadMin()")
			assert.Equal(t, strings.TrimRight(tt.data, "\r\n"), string(got), "ReadMin()")
		})
	}
}

func TestReadMinMessage(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key")
	writeFile(t, p, "0123456789", 0o600)
	_, err := ReadMin(p, 32)
	require.ErrorIs(t, err, ErrTooShort, "ReadMin() error = %v, want ErrTooShort", err)
	for _, want := range []string{"10 bytes", "at least 32"} {
		assert.ErrorContains(t, err, want, "error does not say %q", want)
	}
}

func TestWriteNew(t *testing.T) {
	tests := []struct {
		name     string
		existing string // written before, if not empty
		data     string
	}{
		{name: "new file in new directory", data: "first"},
		{name: "replaces an existing file", existing: "old", data: "new"},
		{name: "binary data", data: "\x00\xff\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state", "keys")
			p := filepath.Join(dir, "key")
			if tt.existing != "" {
				require.NoError(t, os.MkdirAll(dir, 0o700))
				writeFile(t, p, tt.existing, 0o644)
			}
			require.NoError(t, WriteNew(p, []byte(tt.data)), "WriteNew()")
			got, err := os.ReadFile(p)
			require.NoError(t, err)
			assert.Equal(t, tt.data, string(got), "content")
			fi, err := os.Stat(p)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "file mode = %04o, want 0600", fi.Mode().Perm())
			di, err := os.Stat(dir)
			require.NoError(t, err)
			if tt.existing == "" {
				assert.Equal(t, os.FileMode(0o700), di.Mode().Perm(), "dir mode = %04o, want 0700", di.Mode().Perm())
			}
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Len(t, entries, 1, "directory holds %d entries, want only the file (no temporary files left)", len(entries))
		})
	}
}

func TestLoadOrCreate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state", "capability.key")
	first, created, err := LoadOrCreate(p, 32)
	require.NoError(t, err, "LoadOrCreate()")
	assert.True(t, created, "created = false on first call, want true")
	raw, err := base64.RawURLEncoding.DecodeString(string(first))
	require.NoError(t, err, "secret %q is not unpadded base64url", first)
	assert.Len(t, raw, 32, "secret decodes to %d bytes, want 32", len(raw))
	fi, err := os.Stat(p)
	require.NoError(t, err)
	assert.EqualValues(t, 0o600, fi.Mode().Perm(), "file mode = %04o, want 0600", fi.Mode().Perm())
	onDisk, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, string(first)+"\n", string(onDisk), "file content")

	second, created, err := LoadOrCreate(p, 32)
	require.NoError(t, err, "LoadOrCreate() second")
	assert.False(t, created, "created = true on second call, want false")
	assert.Equal(t, first, second, "second call returned a different secret")

	other, _, err := LoadOrCreate(filepath.Join(t.TempDir(), "k"), 32)
	require.NoError(t, err)
	assert.NotEqual(t, first, other, "two created secrets are equal")
}

func TestLoadOrCreateErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, p string)
		n       int
		wantErr error
	}{
		{
			name: "existing world readable file is refused, not replaced",
			setup: func(t *testing.T, p string) {
				writeFile(t, p, content, 0o644)
			},
			n:       32,
			wantErr: ErrPermissions,
		},
		{
			name: "existing empty file is refused, not replaced",
			setup: func(t *testing.T, p string) {
				writeFile(t, p, "", 0o600)
			},
			n:       32,
			wantErr: ErrEmpty,
		},
		{
			name: "existing directory",
			setup: func(t *testing.T, p string) {
				require.NoError(t, os.Mkdir(p, 0o700))
			},
			n:       32,
			wantErr: ErrNotRegular,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "key")
			tt.setup(t, p)
			_, _, err := LoadOrCreate(p, tt.n)
			require.ErrorIs(t, err, tt.wantErr, "LoadOrCreate()")
			assert.NotContains(t, err.Error(), content, "error leaks the content")
		})
	}
	t.Run("invalid length", func(t *testing.T) {
		_, _, err := LoadOrCreate(filepath.Join(t.TempDir(), "k"), 0)
		require.Error(t, err, "LoadOrCreate(n=0) succeeded")
	})
}

func TestLoadOrCreateConcurrent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key")
	const n = 8
	var (
		wg      sync.WaitGroup
		secrets [n][]byte
		created [n]bool
		errs    [n]error
	)
	for i := range n {
		wg.Go(func() {
			secrets[i], created[i], errs[i] = LoadOrCreate(p, 32)
		})
	}
	wg.Wait()
	creators := 0
	for i := range n {
		require.NoError(t, errs[i], "LoadOrCreate()")
		if created[i] {
			creators++
		}
		assert.Equal(t, secrets[0], secrets[i], "caller %d got a different secret", i)
	}
	assert.EqualValues(t, 1, creators, "%d callers created the file, want exactly 1", creators)
}

func FuzzRead(f *testing.F) {
	f.Add([]byte(content))
	f.Add([]byte("a\r\n"))
	f.Add([]byte("\n\n"))
	f.Add([]byte{})
	f.Add([]byte("\x00\xff\r"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "s")
		writeFile(t, p, string(data), 0o600)
		got, err := Read(p)
		want := bytes.TrimRight(data, "\r\n")
		if len(want) == 0 {
			require.ErrorIs(t, err, ErrEmpty, "Read(%q) error = %v, want ErrEmpty", data, err)
			return
		}
		require.NoError(t, err, "Read(%q)", data)
		require.Equal(t, want, got, "Read(%q)", data)
	})
}

func TestReplaceIn(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "secrets"), 0o700))
	old := filepath.Join(dir, "secrets", "svid.pem")
	require.NoError(t, os.WriteFile(old, []byte("old"), 0o600))
	f, err := os.Open(old) // a reader holding the old file keeps reading the old content
	require.NoError(t, err)
	defer f.Close()

	require.NoError(t, ReplaceIn(dir, "secrets", map[string][]byte{"svid.pem": []byte("new"), "bundle.pem": []byte("b")}, -1, -1))
	got, err := os.ReadFile(old)
	require.NoError(t, err)
	assert.Equal(t, "new", string(got))
	held, err := io.ReadAll(f)
	require.NoError(t, err)
	assert.Equal(t, "old", string(held))
	for _, name := range []string{"svid.pem", "bundle.pem"} {
		fi, err := os.Stat(filepath.Join(dir, "secrets", name))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
	}
	entries, err := os.ReadDir(filepath.Join(dir, "secrets"))
	require.NoError(t, err)
	assert.Len(t, entries, 2, "a temporary file was left")
}

// TestReplaceInFollowsNothingOut: the environment owns its secrets directory and may replace
// it, or a file in it, by a symbolic link; nothing is written outside the environment then.
func TestReplaceInFollowsNothingOut(t *testing.T) {
	outside := t.TempDir()
	target := filepath.Join(outside, "passwd")
	require.NoError(t, os.WriteFile(target, []byte("root:x:0:0"), 0o644))

	dir := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "secrets")))
	err := ReplaceIn(dir, "secrets", map[string][]byte{"passwd": []byte("pwned")}, -1, -1)
	require.Error(t, err)

	dir = t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "secrets"), 0o700))
	require.NoError(t, os.Symlink(target, filepath.Join(dir, "secrets", "svid.pem")))
	require.NoError(t, ReplaceIn(dir, "secrets", map[string][]byte{"svid.pem": []byte("new")}, -1, -1))
	fi, err := os.Lstat(filepath.Join(dir, "secrets", "svid.pem"))
	require.NoError(t, err)
	assert.True(t, fi.Mode().IsRegular(), "the link was followed instead of replaced")
	got, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, "root:x:0:0", string(got))

	require.Error(t, ReplaceIn(dir, "secrets", map[string][]byte{"../x": []byte("y")}, -1, -1))
}
