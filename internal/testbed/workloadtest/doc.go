// Package workloadtest runs a fake SPIFFE Workload API for tests. It speaks the real gRPC
// protocol (the SpiffeWorkloadAPI service of go-spiffe's generated proto) on a Unix
// socket, requires the "workload.spiffe.io: true" metadata header like a SPIRE agent, and
// serves the X.509-SVID and X.509 bundle streams; the JWT and WIT calls are unimplemented.
// Until an SVID is set it answers like an agent that has no identity for the caller:
// PermissionDenied, which clients retry.
package workloadtest
