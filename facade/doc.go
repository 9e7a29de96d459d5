// Package facade is dynrunner's RunnerService facade: the RunnerService that the real Gitea
// runner inside an environment talks to unchanged.
//
// The Facade accepts only mutual TLS with a SPIFFE ID bound to an assignment (or, on the
// guest listener of microVMs, the assignment's single-use capability token and the runner
// credentials derived from it), redeems the environment's single-use capability token, hands
// over that assignment's task exactly once, and forwards reports upstream through a
// forge.Forge with the resident runner's credentials after checking the fencing epoch. It
// keeps no state of its own: every decision is an append to the event log, so any number of
// facades can serve.
package facade
