package github_test

import (
	"net/http"
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github"
	"github.com/dynrunner/dynrunner/forge/github/githubtest"
)

// TestRESTWithTheApp: the REST calls use an installation token made from the App's key, one
// for many calls; a token GitHub no longer accepts is refused once (shown in the credential
// gauge) and replaced at the next call.
func TestRESTWithTheApp(t *testing.T) {
	b := newSlotBed(t, 0).bed
	b.failedRun(t, 31)
	before := b.srv.Counts().InstallationTokens
	for range 3 {
		run, err := b.clients.GetWorkflowRun(t.Context(), "octo/hello", 31)
		require.NoError(t, err)
		assert.Equal(t, github.WorkflowRun{ID: 31, Attempt: 1, Status: "completed", Conclusion: "failure"}, run)
		assert.True(t, run.Failed())
	}
	assert.Equal(t, before+1, b.srv.Counts().InstallationTokens, "the installation token was not kept for the next calls")

	b.srv.ExpireInstallationTokens()
	_, err := b.clients.GetWorkflowRun(t.Context(), "octo/hello", 31)
	var apiErr *github.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusUnauthorized, apiErr.Status)
	assert.Zero(t, testutil.ToFloat64(b.metrics.CredentialOK), "a refused token did not show")
	_, err = b.clients.GetWorkflowRun(t.Context(), "octo/hello", 31)
	require.NoError(t, err, "a refused installation token was not made again")

	require.NoError(t, b.clients.RerunFailedJobs(t.Context(), "octo/hello", 31))
	err = b.clients.RerunFailedJobs(t.Context(), "octo/hello", 31)
	require.ErrorAs(t, err, &apiErr, "a run in progress was rerun")
	assert.Equal(t, http.StatusForbidden, apiErr.Status)
	assert.Equal(t, githubtest.MessageRunInProgress, apiErr.Message)
}

// TestRESTWithATokenFile: with a token file the REST calls use its token, read again at each
// call; no error names it. A repository that is not owner/name is refused before any call.
func TestRESTWithATokenFile(t *testing.T) {
	const secret = "ghp_rest-secret-token"
	srv := githubtest.New(t, githubtest.Options{Tokens: []string{secret}})
	file := writeFile(t, "token", secret+"\n")
	clients, err := github.NewClients(github.ClientsConfig{URL: srv.OrgURL("acme"), Auth: github.Auth{TokenFile: file}})
	require.NoError(t, err)

	_, err = clients.GetWorkflowRun(t.Context(), "octo/hello", 404)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), secret)
	var apiErr *github.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusNotFound, apiErr.Status)

	require.NoError(t, os.WriteFile(file, []byte("ghp_revoked"), 0o600))
	err = clients.RerunFailedJobs(t.Context(), "octo/hello", 404)
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusUnauthorized, apiErr.Status, "the rotated token file was not read again")
	assert.NotContains(t, err.Error(), "ghp_revoked")

	calls := srv.Requests(githubtest.OpGetWorkflowRun) + srv.Requests(githubtest.OpRerunFailedJobs)
	for _, repo := range []string{"octo", "octo/../../app", "octo/hello/actions", "octo/hel%2Flo", ""} {
		_, err := clients.GetWorkflowRun(t.Context(), repo, 1)
		require.ErrorIs(t, err, github.ErrBadRepo, "%q", repo)
		require.ErrorIs(t, clients.RerunFailedJobs(t.Context(), repo, 1), github.ErrBadRepo, "%q", repo)
	}
	assert.Equal(t, calls, srv.Requests(githubtest.OpGetWorkflowRun)+srv.Requests(githubtest.OpRerunFailedJobs), "a bad repository reached GitHub")
}
