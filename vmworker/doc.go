// Package vmworker is dynrunner's VM worker: the durable consumer of vm assignments (the
// generic podworker.Worker with the vm tier), a Backend that boots one microVM per job through
// `dynrunner launcher`, and the single-use nonce endpoint guests redeem on the microVM bridge.
//
// A guest never finds a token in its seed: the seed holds an instance id, a nonce and the
// endpoint's URL. The guest redeems the nonce once for its assignment's capability token, the
// facade's URL, SPIFFE ID and CA, and the pinned Gitea runner binary with its SHA-256.
package vmworker
