// Package podworkertest is the one conformance suite every podworker.Backend passes, pod and
// VM backends alike (local, docker, kubernetes, the microVM launcher, opensandbox), in the
// manner of litestream's RunWithReplicaClient and Nomad's DriverHarness.
//
// A backend's test calls RunConformance with a Harness that creates backend instances over
// shared state and describes how to build an environment with a given Behavior. The suite checks
// the contract of podworker.Backend: Start, Wait with exit codes, Destroy (idempotent, ending
// Wait), List, adoption by a second instance as after a controller restart, idempotent and
// concurrent Start of the same task and epoch, a new epoch, Diagnose, and that nothing remains
// after Destroy. Optional capabilities are declared by the harness: secret files, a start that
// never becomes ready, and (NonceHarness) a capability token that reaches the environment only
// through a single-use nonce. Checks a backend cannot do are named in Harness.Without with the
// reason, which the suite reports as the subtest's skip.
package podworkertest
