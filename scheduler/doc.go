// Package scheduler is dynrunner's resident forge runner and its RunnerService facade.
//
// The Scheduler registers once as a runner with the forge (Gitea's RunnerService), fetches
// tasks, routes each by its `runs-on` labels to the pod or vm backend, persists the complete
// assignment to JetStream before anything else, dispatches it, keeps the upstream task alive
// while the environment boots, and fails assignments whose pickup deadline or lease passed.
//
// The Facade serves a RunnerService that the real Gitea runner inside an environment talks to
// unchanged. It accepts only mutual TLS with a SPIFFE ID bound to an assignment, redeems the
// environment's single-use capability token, hands over that assignment's task exactly once,
// and forwards reports upstream with the resident runner's credentials after checking the
// fencing epoch.
package scheduler
