// Package executor is the executor contract and the process that runs a job inside an
// environment.
//
// The contract is Config, the one definition of what an environment is given: the pod worker
// passes it as environment variables (Config.Environ, read back by ParseEnv in `dynrunner
// executor`), the vm worker's nonce endpoint as the grant a microVM guest redeems
// (NewGrant, Grant.Config).
//
// The process (`dynrunner executor`, and the guest inside a microVM) waits for the
// environment's SVID, checks the pinned Gitea runner binary, starts a loopback forwarder that
// carries the runner's plain RunnerService calls to the facade over SPIFFE mTLS, registers the
// runner as ephemeral with the single-use capability token, runs it for exactly one job, and
// renews the assignment's lease on a timer until the runner exits (Run). Every request to the
// facade goes through Failover: the environment is given a list of facades (ParseFacadeURLs)
// and moves to the next when the one it uses stops answering.
package executor
