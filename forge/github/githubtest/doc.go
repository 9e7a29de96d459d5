// Package githubtest is a fake of the GitHub and Actions-service side of runner scale sets, for
// tests: an httptest server that speaks the wire protocol of github.com/actions/scaleset v0.4.0
// exactly as that client sends and parses it, with a Go API through which a test plays GitHub
// (queue a job, assign it, start it on a runner, complete it) and injects faults, and a
// stand-in runner (package standin, command standinrunner) that takes and runs a job with a JIT
// configuration of the fake over a protocol of the fake's own.
//
// # What it models
//
//   - GitHub's REST API under /api/v3 (the GitHub Enterprise Server layout the client uses for any
//     host other than github.com): a GitHub App's JWT (RS256, verified against the App's public
//     key, issuer = the App's client ID or numeric ID, lifetime at most ten minutes) exchanged at
//     POST /app/installations/{id}/access_tokens for an installation token (201); that token or a
//     personal access token exchanged at POST /repos|orgs|enterprises/.../actions/runners/registration-token
//     for a registration token (201); and POST /actions/runner-registration with
//     "Authorization: RemoteAuth <registration token>" for the Actions-service URL and an admin
//     token, a JWT whose exp the client reads to decide when to refresh.
//   - Workflow runs through the REST API, authorised by an installation token or a personal
//     access token: GET /repos/{owner}/{repo}/actions/runs/{run_id} (id, run_attempt, status
//     queued / in_progress / completed, conclusion, run_started_at, repository.full_name) and
//     POST .../rerun-failed-jobs (201 with {}): a completed run gets a new attempt (run_attempt
//     one more, run_started_at now) in which each of its failed or cancelled jobs is queued again
//     as a new job (a JobAvailable message); a run that is not completed is refused with 403
//     {"message": "This workflow is already running"}, GitHub's answer (the GitHub CLI's users
//     recorded it, cli/cli#9221). A run is known under its own repository only (404 otherwise).
//   - The Actions service under that URL, every call carrying api-version and the admin token:
//     runner groups by name, scale set CRUD (_apis/runtime/runnerscalesets), one message session
//     per scale set (create 200, a second one 409 TaskAgentSessionConflictException, refresh with
//     PATCH for a new message-queue token, delete 204), acquirejobs (authorised by the session's
//     message-queue token), generatejitconfig (409 AgentExistsException on a duplicate name) and
//     runners by id and by name (_apis/distributedtask/pools/0/agents; 404 AgentNotFoundException,
//     400 JobStillRunningException when removing a busy runner).
//   - The message queue: a long poll that answers 200 with the oldest undeleted message whose id
//     is above lastMessageId, or 202 with no body when its timeout passes; a message's body is a
//     JSON string holding an array of JobAvailable / JobAssigned / JobStarted / JobCompleted
//     messages, batched while nobody has fetched the message yet; every message and every session
//     carries the scale set's statistics (but for the message a test sends without them,
//     QueueMessageWithoutStatistics); a message stays until it is deleted (the
//     acknowledgement); an expired message-queue token gets 401, on which the client refreshes the
//     session. The client's X-ScaleSetMaxCapacity header is recorded.
//   - A job's life: queued for labels (it goes to the scale set whose labels include all of them),
//     available, acquired by the listener, assigned to the scale set, started on a runner of that
//     scale set, completed with a result; a JIT runner is single-use and is gone once its job has
//     completed.
//   - The runner's side, through a stand-in protocol (below): a runner process started with its
//     JIT configuration takes a job assigned to its scale set, which starts on it (JobStarted with
//     its id and name), and reports it completed (JobCompleted; the runner is gone).
//
// # The stand-in runner and its protocol (not GitHub's)
//
// The real runner (actions/runner) cannot be fetched here, and the fake does not model the
// protocol it speaks: it signs a JWT with the RSA key of its JIT configuration, exchanges it for
// an OAuth token, and talks to the Actions broker (sessions, job messages, job requests, logs,
// timeline, completion). Instead the fake serves a stand-in protocol of its own, defined in
// package standin, and standinrunner is a stand-in runner binary that speaks it; neither is, or
// imitates the wire of, GitHub's runner protocol. Both calls are under the Actions-service URL
// (the ServerUrl of the JIT configuration), authorised by "Authorization: Bearer <credential>"
// with the credential the fake put into the configuration's .credentials (its clientId):
//
//   - POST _standin/runners/{id}/job (OpStandInTakeJob): a long poll, bounded as the message
//     queue's, that takes the oldest job assigned to the runner's scale set and not started,
//     starts it on the runner (as StartJob does) and answers a standin.Job: the runner request
//     id, the job id, the repository, the display name, the workflow run id and JobSpec.Run, the
//     shell script the stand-in runs as the job's only step. 202 when nothing came in time, 401
//     for another credential, 404 for a runner that does not exist, 409 for a runner that already
//     took a job, running or finished (a JIT configuration is single-use).
//   - POST _standin/runners/{id}/jobs/{request id}/complete (OpStandInComplete) with a
//     standin.Completion, {result, log}: completes the job as CompleteJob does and keeps the log
//     for JobLog. 400 for an unknown result, 401, 404, 409 for a job that is not the runner's or
//     already ended otherwise (the test's CompleteJob wins), 413 for an oversize body; a repeat
//     of the completion that ended the job answers 200, so the runner may retry it.
//
// StartJob and CompleteJob still play the runner's side from Go, and mix with the stand-in: a
// job the test completes under a running stand-in has the stand-in's report refused.
// BuildStandInRunner builds the binary for a test. Its command line, environment and exit
// statuses are in the standinrunner command's doc; with Options.TLS it needs the certificate of
// CertificatePEM in a file named by STANDIN_RUNNER_CA_FILE. It reaches the fake at the loopback
// URL in the JIT configuration, so it runs on the test's host or in a namespace that shares the
// host's network.
//
// # Where it simplifies
//
//   - Which runner takes a job: GitHub decides and cannot be told; the fake gives it to the oldest
//     idle runner of the scale set unless the test names one (Server.StartJob). Assignment to the
//     scale set happens when the test calls AssignJob, or on acquisition with
//     Options.AssignOnAcquire, not on GitHub's schedule.
//   - The long poll's timeout is Options.LongPollTimeout (about 50 s on GitHub, short in tests).
//   - One tenant: the owner, repository or enterprise in the configuration URL only selects the
//     registration-token path; every scope sees the same runner groups, scale sets and runners.
//     Registration tokens are reusable until they expire. No rate limits, no pagination.
//   - Tokens are random strings (the admin token a JWT signed with a per-server HMAC key), not
//     GitHub's formats; a session times out for want of polling only with
//     Options.SessionTimeout, and then only when another session of its scale set is asked for
//     (GitHub times out a dead listener's session after a delay it does not document); messages
//     are kept per scale set, so a new session receives what an earlier one left undeleted.
//   - A workflow run is the jobs queued with its id (JobSpec.WorkflowRunID), no workflow file: its
//     status and conclusion are its current attempt's jobs' (completed once all are, a failure if
//     one failed), it has no dependencies between jobs (a rerun queues the failed jobs only,
//     not their dependents), no re-run limits (GitHub's 50 attempts, 30 days) and no
//     permissions (GitHub wants Actions: write for a rerun). The 403 for a rerun of a run with
//     nothing failed is a guess (MessageNothingFailed).
//   - Statistics: TotalAssignedJobs counts jobs assigned to the scale set and not finished
//     (running ones included), which is what the listener scales to; the other totals count jobs
//     or runners in the state they name. GitHub's exact accounting is not documented.
//   - Status codes and exception names for cases the client does not distinguish (a duplicate
//     scale set name, a malformed request body) are plausible guesses, not recorded from GitHub.
//   - The JIT configuration has the shape the real runner reads (base64 of a JSON object of
//     base64 files .runner and .credentials) but holds fake values and no RSA parameters, so the
//     real runner could not use it; the credential in it authorises only the stand-in protocol.
//   - A job is one shell step (JobSpec.Run) with a handful of the real runner's variables; no
//     workflow file, no actions, no checkout, no job log upload or timeline, no cancellation sent
//     to the runner: a test that completes a running job only makes the runner's report fail. A
//     runner that dies after taking its job leaves the job running (GitHub fails it once the
//     runner stops renewing its job request); the test ends it with CompleteJob.
package githubtest
