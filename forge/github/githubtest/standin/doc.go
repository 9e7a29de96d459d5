// Package standin is the stand-in runner of githubtest, for tests only: the JIT configuration
// the fake issues, the stand-in protocol through which a runner takes a job from the fake and
// reports it finished, and the runner's side of that protocol (Runner), which the
// standinrunner command wraps.
//
// None of it is GitHub's. The real runner (actions/runner) decodes the same shape of JIT
// configuration, but then exchanges its RSA-signed JWT for an OAuth token and talks to the
// Actions broker (sessions, job messages, job requests, logs, timeline, job completion); the
// fake models none of that. The stand-in protocol is two plain HTTP calls under the
// configuration's Actions-service URL, authorised by the credential of .credentials as a bearer
// token (see TakeJobURL and CompleteURL), so that a test can run a runner process inside an
// environment and see on the fake which job it took and how the job ended. The package imports
// only the standard library, so the stand-in binary carries nothing of the test tree.
package standin
