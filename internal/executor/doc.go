// Package executor is what runs inside a one-shot environment (`dynrunner executor`): it waits
// for the environment's SVID, checks the pinned Gitea runner binary, starts a loopback
// forwarder that carries the runner's plain RunnerService calls to the facade over SPIFFE
// mTLS, registers the runner as ephemeral with the single-use capability token, runs it for
// exactly one job, and renews the assignment's lease on a timer until the runner exits.
package executor
