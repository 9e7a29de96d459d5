package fleetbed

import (
	"os"
	"strings"
	"testing"

	"github.com/dynrunner/dynrunner/internal/devforge"
)

// Need returns the real Gitea and runner for a bed, once the Docker engine answers; without
// either the test is skipped, or fails under CI (which provides both).
func Need(t *testing.T) devforge.Tools {
	t.Helper()
	tools, err := devforge.FindTools()
	if err == nil {
		err = NeedDocker(t.Context())
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return tools
}

// TestOutput is an Options.Output that writes a bed's progress lines to t's log.
type TestOutput struct{ T *testing.T }

func (w TestOutput) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Tail is the last n lines of s (container logs in a failed test's output).
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
