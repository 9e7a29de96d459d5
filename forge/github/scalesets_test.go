package github_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github"
	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
)

// TestEnsureScaleSetsAdoptsOneMadeMeanwhile: two replicas start at once, both find no scale set
// and both create it; GitHub refuses the second of the name, and that replica adopts the
// first's instead of failing.
func TestEnsureScaleSetsAdoptsOneMadeMeanwhile(t *testing.T) {
	b := newBed(t)
	ctx := t.Context()
	pod := github.ScaleSets{Prefix: "dynrunner", RunnerGroup: github.DefaultRunnerGroup, Tiers: []assignment.Backend{assignment.BackendPod}}
	first, err := github.EnsureScaleSets(ctx, b.clients.Client(), pod)
	require.NoError(t, err)

	// The second replica looked before the first had created it.
	b.srv.InjectFault(githubtest.OpGetScaleSet, githubtest.Fault{Status: http.StatusOK, Body: `{"count":0,"value":[]}`})
	second, err := github.EnsureScaleSets(ctx, b.clients.Client(), pod)
	require.NoError(t, err)
	assert.Equal(t, first, second, "the replica did not adopt the scale set made meanwhile")
	assert.Len(t, b.srv.ScaleSets(), 1)
	assert.Equal(t, 2, b.srv.Requests(githubtest.OpCreateScaleSet), "both replicas tried to create it")
}
