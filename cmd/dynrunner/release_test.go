package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// module is this module's path; only its own packages are held to the test-package rule (a
// dependency's `.../api/latest` is not a test kit).
const module = "github.com/dynrunner/dynrunner"

// testPackages returns the packages of deps that are test harnesses or test kits and must not
// ship in the release binary: everything under internal/testbed/, and every package of this
// module whose name ends in "test" (forgetest, githubtest, podworkertest, eventlogtest, ...).
func testPackages(deps []string) []string {
	var bad []string
	for _, p := range deps {
		if p != module && !strings.HasPrefix(p, module+"/") {
			continue
		}
		if strings.Contains(p+"/", "/internal/testbed/") || strings.HasSuffix(p[strings.LastIndex(p, "/")+1:], "test") {
			bad = append(bad, p)
		}
	}
	return bad
}

func TestTestPackages(t *testing.T) {
	deps := []string{
		"fmt",
		"internal/synctest",
		"k8s.io/client-go/tools/clientcmd/api/latest",
		module + "/internal/devforge",
		module + "/internal/testbed/devforge",
		module + "/internal/testbed",
		module + "/forge/forgetest",
		module + "/forge/github/githubtest",
		module + "/podworker/podworkertest",
		module + "/internal/eventlog/eventlogtest",
		module + "/internal/eventlog",
	}
	assert.Equal(t, []string{
		module + "/internal/testbed/devforge",
		module + "/internal/testbed",
		module + "/forge/forgetest",
		module + "/forge/github/githubtest",
		module + "/podworker/podworkertest",
		module + "/internal/eventlog/eventlogtest",
	}, testPackages(deps))
}

// TestReleaseHasNoTestPackages lists the packages the dynrunner binary is built from and fails
// if a test harness or test kit is among them: docs/architecture.md's code map says none ships.
func TestReleaseHasNoTestPackages(t *testing.T) {
	// The go command of the toolchain that built this test; go test does not put GOROOT in the
	// environment, and PATH may name another toolchain.
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go") //nolint:staticcheck // the toolchain running go test is installed
	out, err := exec.CommandContext(t.Context(), goCmd, "list", "-deps", ".").Output()
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
		t.Logf("go list stderr:\n%s", exit.Stderr)
	}
	require.NoError(t, err, "go list -deps ./cmd/dynrunner")
	deps := strings.Fields(string(out))
	require.Contains(t, deps, module+"/cmd/dynrunner", "go list did not list the binary's own package")
	assert.Empty(t, testPackages(deps), "test packages ship in the release binary; move what the binary needs out of internal/testbed and the *test packages")
}
