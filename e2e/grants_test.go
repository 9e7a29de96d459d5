package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/devforge"
)

// TestGrantsRefuseAPodJobOfAVMOnlyRepository: one controller serves two repositories of the
// real Gitea, with a GRANTS_FILE that grants the owner both tiers and one repository vm only.
// That repository's `[self-hosted, pod]` job fails in Gitea with a message naming the grant,
// and runs nothing; the same job of the other repository runs green.
func TestGrantsRefuseAPodJobOfAVMOnlyRepository(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	ctx := t.Context()
	trusted, err := f.CreateRepo(ctx, "trusted")
	require.NoError(t, err)
	contracted, err := f.CreateRepo(ctx, "contracted")
	require.NoError(t, err)
	policy := filepath.Join(t.TempDir(), "grants.yaml")
	require.NoError(t, os.WriteFile(policy, []byte("owners:\n  "+devforge.AdminUser+": [pod, vm]\nrepositories:\n  "+contracted.String()+": [vm]\n"), 0o600))

	c := newController(t, tools, f, devforge.AdminUser, leaseEnv, pickupEnv, "GRANTS_FILE="+policy)
	c.start()

	const workflow = "name: granted\non: [push]\njobs:\n  build:\n    runs-on: [self-hosted, pod]\n    steps:\n      - run: echo the job ran\n"
	results := make(chan map[string]jobResult, 1)
	go func() { results <- runWorkflow(t, f, trusted, workflow, 5*time.Minute) }()
	refused := runWorkflow(t, f, contracted, workflow, 5*time.Minute)["build"]
	granted := (<-results)["build"]

	assert.Equal(t, "success", granted.conclusion, "the granted repository's job:\n%s", granted.log)
	assert.Contains(t, granted.log, "the job ran")
	assert.Equal(t, "failure", refused.conclusion, "the vm-only repository's pod job:\n%s", refused.log)
	assert.Contains(t, refused.log, `dynrunner: this job was not run: isolation tier not granted: the job asks for pod, but grant repositories["`+contracted.String()+`"] of GRANTS_FILE allows repository `+contracted.String()+` only [vm]; use runs-on: [self-hosted, vm]`)
	assert.NotContains(t, refused.log, "the job ran")
	assertNoEnvironmentsLeft(t, c)
}
