package standin

import (
	"fmt"
	"net/url"
	"strconv"
)

// The stand-in protocol is this package's own, not GitHub's: two calls under the Actions-service
// URL of the JIT configuration (ServerUrl), authorised by "Authorization: Bearer <credential>"
// with the credential of the configuration's .credentials file. Error answers are JSON objects
// with a "message" (the Actions service's exception shape).
//
//   - POST {ServerUrl}_standin/runners/{runner id}/job takes a job: a long poll that answers 200
//     with a Job once one is assigned to the runner's scale set, or 202 with no body when the
//     fake's long-poll timeout passes (poll again). 401 for a wrong credential, 404 for a runner
//     that does not exist (never did, or was removed), 409 for a runner that already took a job.
//   - POST {ServerUrl}_standin/runners/{runner id}/jobs/{runner request id}/complete with a
//     Completion finishes the runner's job: 200; 400 for an unknown result, 401, 404, 409 if it
//     is not the runner's job or the job already ended otherwise, 413 for a body over
//     MaxCompletionBytes. A repeat of the call that completed the job answers 200 again, so that
//     it can be retried.

// The results a job completes with.
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
	ResultCanceled  = "canceled"
)

// MaxLogBytes bounds the log a runner sends; the stand-in keeps the first MaxLogBytes of the
// output and marks the cut.
const MaxLogBytes = 256 << 10

// MaxCompletionBytes bounds a completion request body (a log of MaxLogBytes, JSON-escaped).
const MaxCompletionBytes = 8 * MaxLogBytes

// Job is the answer to a runner taking a job.
type Job struct {
	// RunnerRequestID is the job's id in the scale set's messages.
	RunnerRequestID int64  `json:"runnerRequestId"`
	JobID           string `json:"jobId"`
	Owner           string `json:"owner"`
	// Repository is owner/name, as GITHUB_REPOSITORY.
	Repository    string `json:"repository"`
	WorkflowRef   string `json:"workflowRef"`
	DisplayName   string `json:"displayName"`
	EventName     string `json:"eventName"`
	WorkflowRunID int64  `json:"workflowRunId"`
	// Run is the shell script of the job's single step; empty succeeds at once.
	Run string `json:"run"`
}

// Completion is what a runner reports when its job ends.
type Completion struct {
	Result string `json:"result"`
	Log    string `json:"log"`
}

// ValidResult reports whether result is one a job may complete with.
func ValidResult(result string) bool {
	return result == ResultSucceeded || result == ResultFailed || result == ResultCanceled
}

// TakeJobURL is where runner runnerID of the Actions service at serverURL takes its job.
func TakeJobURL(serverURL string, runnerID int) (string, error) {
	u, err := url.JoinPath(serverURL, "_standin", "runners", strconv.Itoa(runnerID), "job")
	if err != nil {
		return "", fmt.Errorf("standin: server URL %q: %w", serverURL, err)
	}
	return u, nil
}

// CompleteURL is where runner runnerID reports job requestID complete.
func CompleteURL(serverURL string, runnerID int, requestID int64) (string, error) {
	u, err := url.JoinPath(serverURL, "_standin", "runners", strconv.Itoa(runnerID), "jobs", strconv.FormatInt(requestID, 10), "complete")
	if err != nil {
		return "", fmt.Errorf("standin: server URL %q: %w", serverURL, err)
	}
	return u, nil
}
