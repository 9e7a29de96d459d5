// Package fleetbed runs dynrunner split over several hosts for tests and for
// `go tool task chaos`: every component in a container of its own, with its own address, on a
// private Docker network the bed creates.
//
// A bed holds a 3-node NATS JetStream cluster (an image FROM scratch holding nats-server built
// from the module's own dependency), schedulers, facades and pod workers (an image FROM scratch
// holding the static dynrunner binary, each process with its own COMPONENTS), and the pod
// workers' job containers, siblings on the same network made by the docker pod backend through
// the host's engine. The real Gitea of internal/devforge runs on the host and listens on
// the network's gateway, so the containers reach it as they would a forge on another machine.
//
// Nothing in a bed is faked; its faults are the operator's: [Bed.Kill] is `docker kill`,
// [Bed.Partition] is `docker network disconnect`. Everything the bed starts carries the label
// dynrunner.testbed=<id> and [Bed.Close] removes it (also after a failed test: [Start] registers
// Close with t.Cleanup), together with the network and the pod workers' state directory; [Start]
// first removes what an earlier, killed test process left.
//
// With Options.NATSOnly a bed is the network and the NATS cluster alone, for a caller that runs
// containers of its own on it ([Bed.Command], e.g. BenchmarkLifecyclesCluster's controller
// replicas) and reads their CPU time from their cgroups ([Container.CPUTime]).
//
// The bed talks only to what it started: the containers on its network, and Gitea on the
// gateway.
package fleetbed
