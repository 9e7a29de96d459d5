// Package podworkertest is the conformance suite every podworker.Backend must pass (local now,
// docker and kubernetes later), in the manner of litestream's RunWithReplicaClient and Nomad's
// DriverHarness.
//
// A backend's test calls RunConformance with a Harness that creates backend instances over
// shared state and describes how to build an environment with a given Behavior. The suite checks
// the contract of podworker.Backend: Start, Wait with exit codes, Destroy (idempotent, ending
// Wait), List, adoption by a second instance as after a controller restart, idempotent Start of
// the same task and epoch, secret files, and that nothing remains after Destroy.
package podworkertest
