package githubtest

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
)

// StandInRunnerPackage is the import path of the stand-in runner command.
const StandInRunnerPackage = "github.com/dynrunner/dynrunner/forge/github/githubtest/standinrunner"

// ErrNoGoCommand: the go command is not on PATH, so the stand-in runner cannot be built; a test
// that needs it skips, saying so.
var ErrNoGoCommand = errors.New("the go command is not on PATH; run the tests with `go test` from a Go toolchain")

// BuildStandInRunner builds the stand-in runner into dir with the go command (with -race when
// this binary has the race detector) and returns its path. It runs go build each time; build
// once per test binary. The working directory must be inside this module, as a test's is.
func BuildStandInRunner(dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("githubtest: build the stand-in runner: %w (%w)", ErrNoGoCommand, err)
	}
	out := filepath.Join(dir, "standinrunner")
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	if b, err := exec.Command(goTool, append(args, StandInRunnerPackage)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("githubtest: go build %s: %w\n%s", StandInRunnerPackage, err, b)
	}
	return out, nil
}
