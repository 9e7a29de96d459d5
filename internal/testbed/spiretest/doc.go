// Package spiretest runs a real SPIRE server and agent for tests.
//
// Start runs spire-server and spire-agent (Version, which scripts/spire-tools.sh builds and
// caches; it skips the test with that command when they are missing, and fails it when CI is
// set) with their files in a temporary directory, and returns once both pass their health
// checks (under a second on two cores). The test's cleanup stops both process groups (SIGTERM, SIGKILL
// after ten seconds; on Linux they also die with the test binary) and removes the directory;
// when the test failed it logs the end of both logs first.
//
// The server listens on a free loopback port, keeps its entries in SQLite and its keys in
// memory, attests agents with join tokens and signs X509-SVIDs for X509SVIDTTL; it reloads
// its entry cache every CacheReloadInterval. Tests drive it through its admin socket
// (SPIRE.ServerSocket) with the spire-server command line: CreateEntry, DeleteEntry, Entries.
//
// The agent attests with a join token (its ID is SPIRE.AgentID, the parent of the workload
// entries), bootstraps insecurely, keeps its keys in memory and syncs its entries every
// SyncInterval. It attests workloads with the unix plugin (uid, gid, and with
// discover_workload_path the executable's path and SHA-256) and the docker plugin (labels,
// environment and image of the container a process runs in, from the Docker engine at
// DockerSocket). Its Workload API socket is alone in SPIRE.AgentSocketDir (mode 0755, the
// socket 0777), so a container may bind-mount the directory, read-only, and reach it as any
// user.
package spiretest
