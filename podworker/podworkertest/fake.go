package podworkertest

import (
	"os"
	"path/filepath"
)

// WriteJobFiles is what a fake executor does for the WriteFilesAndExit behaviour: it writes
// into the work directory, HOME and TMPDIR, including a read-only tree like Go's module
// cache, so the suite can check that Destroy removes all of it.
func WriteJobFiles() error {
	for _, d := range []string{os.Getenv("DYNRUNNER_WORK_DIR"), os.Getenv("HOME"), os.Getenv("TMPDIR")} {
		if err := os.WriteFile(filepath.Join(d, "file"), []byte("x"), 0o644); err != nil {
			return err
		}
	}
	mod := filepath.Join(os.Getenv("HOME"), "go", "pkg", "mod", "example.com", "m@v1.0.0")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module example.com/m\n"), 0o444); err != nil {
		return err
	}
	for d := mod; d != os.Getenv("HOME"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o555); err != nil {
			return err
		}
	}
	return nil
}
