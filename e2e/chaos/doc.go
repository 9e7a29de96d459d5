// Package chaos holds the multi-host chaos tests: dynrunner split over containers of
// internal/testbed/fleetbed (a 3-node NATS cluster, two schedulers, two facades, two pod
// workers), driven with real Gitea jobs while containers are killed, partitioned and
// restarted. Run them alone with `go tool task chaos`.
package chaos
