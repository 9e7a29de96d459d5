package githubtest_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
)

// getRun reads a workflow run through the REST API as the controller does.
func getRun(t *testing.T, srv *githubtest.Server, path, auth string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL()+"/api/v3/repos/"+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp.StatusCode, body
}

// TestWorkflowRuns: a run's status follows its current attempt's jobs; rerun-failed-jobs is
// refused while the run is in progress (403 "This workflow is already running", as GitHub
// does) and when nothing failed, and otherwise starts a new attempt in which each failed job is
// queued again; a run answers only under its own repository, and only with a valid token.
func TestWorkflowRuns(t *testing.T) {
	srv := newServer(t, nil)
	podScaleSet(t.Context(), t, appClient(t, srv))
	auth := "Bearer " + testPAT
	const run = 77
	a, err := srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, WorkflowRunID: run, DisplayName: "a"})
	require.NoError(t, err)
	b, err := srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, WorkflowRunID: run, DisplayName: "b"})
	require.NoError(t, err)
	rerunURL := srv.URL() + "/api/v3/repos/octo/hello/actions/runs/" + strconv.Itoa(run) + "/rerun-failed-jobs"

	code, body := getRun(t, srv, "octo/hello/actions/runs/77", auth)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, githubtest.RunQueued, body["status"])
	assert.EqualValues(t, 1, body["run_attempt"])
	assert.Nil(t, body["conclusion"])

	require.NoError(t, srv.CompleteJob(a, "succeeded"))
	code, body = getRun(t, srv, "octo/hello/actions/runs/77", auth)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, githubtest.RunInProgress, body["status"])
	assert.Equal(t, http.StatusForbidden, post(t, rerunURL, auth, ""), "a run in progress was rerun")

	require.NoError(t, srv.CompleteJob(b, "failed"))
	code, body = getRun(t, srv, "octo/hello/actions/runs/77", auth)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, githubtest.RunCompleted, body["status"])
	assert.Equal(t, githubtest.ConclusionFailure, body["conclusion"])

	code, _ = getRun(t, srv, "octo/other/actions/runs/77", auth)
	assert.Equal(t, http.StatusNotFound, code, "a run answered under another repository")
	code, _ = getRun(t, srv, "octo/hello/actions/runs/77", "Bearer ghp_wrong")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Equal(t, http.StatusUnauthorized, post(t, rerunURL, "", ""))
	assert.Equal(t, http.StatusNotFound, post(t, srv.URL()+"/api/v3/repos/octo/other/actions/runs/77/rerun-failed-jobs", auth, ""))

	require.Equal(t, http.StatusCreated, post(t, rerunURL, auth, ""))
	got, err := srv.WorkflowRun(run)
	require.NoError(t, err)
	assert.Equal(t, 2, got.Attempt)
	assert.Equal(t, 1, got.Reruns)
	assert.Equal(t, githubtest.RunQueued, got.Status)
	jobs := srv.RunJobs(run)
	require.Len(t, jobs, 3, "the failed job was not queued again, or the succeeded one was")
	again := jobs[2]
	assert.Equal(t, 2, again.Attempt)
	assert.Equal(t, githubtest.JobQueued, again.State)
	assert.Equal(t, http.StatusForbidden, post(t, rerunURL, auth, ""), "a rerun's attempt in progress was rerun")

	require.NoError(t, srv.CompleteJob(again.ID, "succeeded"))
	got, err = srv.WorkflowRun(run)
	require.NoError(t, err)
	assert.Equal(t, githubtest.ConclusionSuccess, got.Conclusion)
	assert.Equal(t, http.StatusForbidden, post(t, rerunURL, auth, ""), "a run with nothing failed was rerun")
	assert.Equal(t, 6, srv.Requests(githubtest.OpRerunFailedJobs), "the fake counts every rerun call, refused ones too")
	got, err = srv.WorkflowRun(run)
	require.NoError(t, err)
	assert.Equal(t, 1, got.Reruns, "a refused rerun was counted")

	_, err = srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, WorkflowRunID: run, Repository: "other"})
	require.ErrorIs(t, err, githubtest.ErrRunRepository)
}
