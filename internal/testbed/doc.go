// Package testbed groups the harnesses the tests start real components with; nothing under
// it ships in a controller except devforge, which `dynrunner demo` uses to run its throw-away
// Gitea. Production code lives outside this folder.
//
//   - devforge: a real Gitea and real Gitea runners from the cached tools (scripts/tools.sh)
//   - kubetest: a real etcd and kube-apiserver, and a test kubelet that runs Pods as Docker containers
//   - spiretest: a real SPIRE server and agent
//   - netnstest: network namespaces and veth pairs, for hosts with their own addresses
//   - testproc: child processes that die with the test
//   - workloadtest: a fake SPIFFE Workload API speaking the real gRPC protocol
package testbed
