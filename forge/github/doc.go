// Package github is dynrunner's second forge: GitHub (github.com and GitHub Enterprise
// Server) workflows that target [self-hosted, pod] or [self-hosted, vm], served by the same
// one-shot tiers as Gitea's, through runner scale sets (issue 14). It holds the controller's
// clients of GitHub (Clients: a GitHub App or a token file, refreshed before the tokens age
// out, on rotation and after GitHub refused them; and the REST calls the scaleset library does
// not make, rest.go), the scale sets per tier (EnsureScaleSets), the one message session per
// scale set across all scheduler replicas (Session, owned through a lease in JetStream), its
// handler Slots, the reruns of jobs whose environment was lost (Reruns), and the test fake in
// githubtest. Only the pod tier is served so far (docs/github.md).
//
// GitHub has no call through which a resident runner fetches a task. A runner scale set is its
// way to serve jobs on demand: a listener holds a message session, long-polls for JobAvailable,
// JobAssigned, JobStarted and JobCompleted messages and statistics, acquires available jobs and
// creates one single-use JIT runner configuration per environment; GitHub then gives some queued
// job of the scale set to that runner, and cannot be told which. The package uses GitHub's
// own client, github.com/actions/scaleset, pinned at v0.4.0 (it has AcquireJobs, which GitHub
// Enterprise Server still needs).
//
//   - One scale set per tier (labels self-hosted + pod, self-hosted + vm), created or adopted at
//     start, so a vm job can only ever reach the vm scale set's environments.
//   - Each environment slot is persisted in JetStream before GitHub is called: the intent, then
//     the JIT configuration sealed like a Gitea task, then started. The GitHub runner id is
//     recorded and cleanup removes that runner by id, so a controller that dies midway neither
//     leaks runners nor starts two environments for one slot. JobStarted records, after the fact,
//     which job the slot's runner took: the binding is the forge's, not dynrunner's.
//   - Inside the environment the real GitHub Actions runner runs once with --jitconfig and talks
//     to GitHub itself; the JIT configuration is the only credential it gets. The App key and
//     installation tokens never leave the controller.
//   - Credentials come only from files: a GitHub App (id, installation id, private key file) or
//     a token file; tokens are refreshed before they expire and a failed refresh fails closed.
//   - Scaling follows the session's statistics (assigned jobs), never above capacity; one message
//     session per scale set across all scheduler replicas, owned through a lease in JetStream
//     (GitHub refuses a second session with 409).
//   - Bad messages change nothing (docs/github.md, "Bad messages"): a job whose labels are not
//     the scale set's (Fits) is refused, a message without statistics scales nothing, an
//     answer the client cannot parse is read again and handled as far as it can be, job
//     messages that name no slot's runner or another job are ignored, and a session of
//     another scale set is refused.
//   - A job whose environment was lost (the worker records failed with lost: true after
//     JobStarted named the job's run and repository) is rerun through rerun-failed-jobs once
//     its run has completed: the loss is noted in the run's record in JetStream
//     (eventlog.BucketGitHubReruns) before the slot is closed; every replica follows the
//     records and reads the run's status; one claims the call by compare-and-swap and calls
//     once; a claimer that died is taken over, and the run's attempt tells whether its call
//     went through. At most GITHUB_RERUNS reruns per run. Gitea has no rerun to match: its
//     lost jobs fail.
package github
