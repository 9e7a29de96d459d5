// Package testbed groups the harnesses the tests start real components with; nothing under
// it ships in the dynrunner binary (TestReleaseHasNoTestPackages in cmd/dynrunner checks it).
// Production code lives outside this folder. The throw-away Gitea the tests and `dynrunner demo`
// share is internal/devforge, outside this folder because the demo ships.
//
//   - fleetbed: a split deployment, each component in its own container
//   - kubetest: a real etcd and kube-apiserver, and a test kubelet that runs Pods as Docker containers
//   - spiretest: a real SPIRE server and agent
//   - netnstest: network namespaces and veth pairs, for hosts with their own addresses
//   - testproc: child processes that die with the test
//   - workloadtest: a fake SPIFFE Workload API speaking the real gRPC protocol
package testbed
