package launcher

import (
	"os"
	"path/filepath"
	"testing"
)

// skipOrFail skips t because something is missing, with the command that provides it; in CI
// (CI set) it fails instead: CI provides everything.
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	msg := why + "; install with: sudo scripts/vm-deps.sh"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// directIODir returns a new directory on a file system that takes O_DIRECT: below the system's
// temporary directory when it allows it (not tmpfs), else below $HOME/.cache/dynrunner. The
// path stays short, so that unix sockets below it fit.
func directIODir(t testing.TB) string {
	t.Helper()
	bases := []string{os.TempDir()}
	if home, err := os.UserHomeDir(); err == nil {
		bases = append(bases, filepath.Join(home, ".cache", "dynrunner"))
	}
	for _, base := range bases {
		if err := os.MkdirAll(base, 0o755); err != nil {
			continue
		}
		dir, err := os.MkdirTemp(base, "lt-")
		if err != nil {
			continue
		}
		if probeDirectIO(dir) == nil {
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			return dir
		}
		_ = os.RemoveAll(dir)
	}
	t.Fatalf("no directory on a file system that takes O_DIRECT below %v", bases)
	return ""
}
