package devforge

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Versions of the real components, kept in step with scripts/tools.sh.
const (
	GiteaVersion  = "v1.27.3"
	RunnerVersion = "v1.0.8"
)

// ToolsCommand is the command that builds the binaries [FindTools] looks for.
const ToolsCommand = "bash scripts/tools.sh all (or: go tool task tools)"

// ErrToolsMissing is returned (wrapped) by [FindTools] when a binary has not been built yet.
// Tests use it to skip with [ToolsCommand] outside CI.
var ErrToolsMissing = errors.New("devforge: gitea tools not built, run " + ToolsCommand)

// Tools are the cached binaries of the real components.
type Tools struct {
	GiteaBin      string // the gitea binary
	GiteaDir      string // gitea's source tree, used as STATIC_ROOT_PATH (templates, locales)
	RunnerBin     string // the gitea-runner binary
	RunnerSHA256  string // hex sha256 of RunnerBin, as written by scripts/tools.sh
	GiteaVersion  string
	RunnerVersion string
}

// FindTools locates the binaries under the cache root: $DYNRUNNER_CACHE if set, else
// $HOME/.cache/dynrunner. It never builds anything; see [ErrToolsMissing].
func FindTools() (Tools, error) {
	root := os.Getenv("DYNRUNNER_CACHE")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return Tools{}, fmt.Errorf("devforge: locate cache: %w", err)
		}
		root = filepath.Join(home, ".cache", "dynrunner")
	}
	return FindToolsIn(root)
}

// FindToolsIn is [FindTools] with an explicit cache root (the folder holding tools/).
func FindToolsIn(root string) (Tools, error) {
	giteaDir := filepath.Join(root, "tools", "gitea-"+GiteaVersion)
	runnerDir := filepath.Join(root, "tools", "gitea-runner-"+RunnerVersion)
	t := Tools{
		GiteaBin:      filepath.Join(giteaDir, "gitea"),
		GiteaDir:      giteaDir,
		RunnerBin:     filepath.Join(runnerDir, "gitea-runner"),
		GiteaVersion:  GiteaVersion,
		RunnerVersion: RunnerVersion,
	}
	for _, bin := range []string{t.GiteaBin, t.RunnerBin} {
		if err := checkExecutable(bin); err != nil {
			return Tools{}, fmt.Errorf("%w: %w", ErrToolsMissing, err)
		}
	}
	sum, err := os.ReadFile(t.RunnerBin + ".sha256")
	if err != nil {
		return Tools{}, fmt.Errorf("%w: %w", ErrToolsMissing, err)
	}
	t.RunnerSHA256 = strings.TrimSpace(string(sum))
	return t, nil
}

func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
