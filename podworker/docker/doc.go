// Package docker is the pod worker's "docker" backend: each job's environment is one hardened
// container on a single Docker host, for hosts without a Kubernetes cluster. It talks to the
// Docker Engine API (v1.41, Docker 20.10, or newer) over its unix socket with the official
// client, github.com/moby/moby/client, which negotiates the engine's own API version; the
// client and its OpenTelemetry HTTP instrumentation add about 2.4 MB (2%) to the dynrunner binary.
//
// # Containers
//
// One container per environment, named "dynrunner-<task>-<epoch>" ("dynrunner-<scope>-<task>-
// <epoch>" outside the default scope) and labelled dynrunner.managed=true, dynrunner.scope,
// dynrunner.task and dynrunner.epoch. It runs Config.Image, which must be pinned by digest: a
// local image ID (sha256:<64 hex>, what scripts/executor-image.sh prints) or name@sha256:<64
// hex>. The backend never pulls; the image must be in the engine's store (Check says so at
// boot).
//
// By default every container is hardened:
//
//   - all capabilities dropped (CapDrop ALL) and no-new-privileges, so setuid binaries and file
//     capabilities cannot raise privileges again;
//   - a read-only root file system; writable are only tmpfs mounts at /tmp (mode 1777), WorkDir
//     and HomeDir (mode 0700, owned by Config.User), all with exec allowed (jobs run scripts and
//     binaries there) but nosuid and nodev, each at most Config.Memory in size;
//   - memory (swap included: no swap), CPU and pids limits; tmpfs pages count against the memory
//     limit, so the job and its files share it;
//   - a non-root user, Config.User (1000:1000 by default, the executor image's "runner");
//   - docker-init as PID 1, which reaps the zombies a job's processes leave and forwards
//     signals to the executor;
//   - a private IPC namespace.
//
// Spec.Env becomes the container's environment, followed by the backend's own variables
// (DYNRUNNER_SECRETS_DIR=SecretsDir, DYNRUNNER_WORK_DIR=WorkDir, HOME=HomeDir, TMPDIR=/tmp),
// which win. Spec.Files are written to <StateDir>/<name>/secrets (directory 0700, files 0600,
// both owned by Config.User) and bind-mounted read-only at SecretsDir; for a GitHub slot
// (executor.IsGitHub of Spec.Env) it is mounted writable, as the executor removes the slot's
// JIT configuration from it once read, before the runner starts. Because the engine
// resolves bind-mount sources on its own host, the controller must run on the Docker host and
// see StateDir at the same path as the engine (when the controller itself runs in a container,
// mount StateDir at the same path inside).
//
// With Config.SpiffeSocket, the directory of the SPIRE agent's Workload API socket is also
// bind-mounted read-only at SpiffeSocketDir and SPIFFE_ENDPOINT_SOCKET (one of the backend's own
// variables then) names the socket there; not for a GitHub slot, whose runner talks to GitHub,
// not to the facade. SPIRE's docker workload attestor reports the
// container's labels, so `dynrunner identity` (IDENTITY_SOURCE=docker) registers each running
// container by LabelScope, LabelTask and LabelEpoch; it finds them with an Inventory.
//
// # Network
//
// Config.Network defaults to DefaultNetwork, "dynrunner". PrepareNetwork, called at boot,
// creates a network of that name when it does not exist: a bridge with inter-container
// communication off (com.docker.network.bridge.enable_icc=false), labelled
// dynrunner.managed=true, on the subnet the caller gives or one the engine picks. Such a
// managed network is what Firewall is for: an nftables table through which the host accepts
// from the bridge only the facade (which the controller serves on the network's gateway) and a
// forge on the host, so a job cannot reach the host's loopback services, the controller's
// metrics, or the event bus. Traffic to other hosts is routed as Docker routes it. A network
// that exists but is not labelled as dynrunner's is used as it is: its owner decides what it
// reaches.
//
// "host" is an explicit choice: the container shares the host's network namespace, so the
// executor reaches a facade and a forge that listen on loopback, and a job reaches every
// service of the host that listens on loopback (the embedded NATS server, which needs a
// password; the controller's metrics), sees the host's interfaces and can bind ports on them.
//
// # Privileged
//
// Config.Privileged is an explicit opt-in for jobs that need to run containers or mount file
// systems themselves. The container then runs as root (unless Config.User says otherwise) with
// every capability, every host device, and no seccomp or AppArmor confinement: a job can take
// over the host. The read-only root, the limits and no-new-privileges stay. Use it only for
// trusted repositories.
//
// # Lifecycle
//
// Start serialises on a flock(2) file <StateDir>/.locks/<name>, so concurrent Starts of one
// assignment (several backend instances, or controller processes sharing StateDir) create one
// container. A running container of the same name is returned as is; a stopped one (an executor
// that already exited, or a start interrupted by a crash) is removed with its secrets and
// created afresh.
//
// Handle.ID is the container name; Handle.Data holds "container_id". Wait uses the engine's
// wait endpoint (condition not-running), for handles of this instance and adopted ones alike, so
// the exit code is always known; "oom" is the reason when the kernel killed the container for
// memory. While the engine cannot be reached or answers with a server error (a restart of the
// engine, which with live-restore keeps containers running), Wait retries until its context
// ends rather than report the environment lost. The worker does not wait: Notify serves every
// environment from one subscription to the engine's event stream (die, oom and destroy events
// of Config.Scope), inspects each container once after subscribing and again after each
// reconnection, and computes the Exit as Wait does. Destroy stops the container with Config.Grace, force-removes it (with its anonymous
// volumes) and removes its secrets directory; it is idempotent. List reports the managed
// containers of Config.Scope, plus every entry of StateDir without a container (a crash between
// writing secrets and creating the container) as a Handle with nil Data.
//
// Diagnose reads the container's stderr (the executor's own log and error line; the job's output
// goes to stdout) and returns the last line starting with podworker.ExecutorErrorPrefix.
package docker
