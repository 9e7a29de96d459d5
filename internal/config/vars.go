// Package config loads dynrunner's configuration from the environment into plain structs and
// validates it, failing closed: a half-configured setting is a boot error that says what to
// set. Long-lived credentials are only ever read from files (*_FILE variables).
package config

// Var documents one environment variable. docs/configuration.md lists every Var with its
// default; a test keeps the two in step.
type Var struct {
	Name    string
	Default string
	Doc     string
}

// Controller variables.
var ControllerVars = []Var{
	{"COMPONENTS", "all", "Comma-separated components to run: scheduler, facade, pod-worker, vm-worker. all = scheduler, facade and pod-worker, plus vm-worker when VM_IMAGE is set."},
	{"TIERS", "pod (+ vm with the vm worker)", "Isolation tiers the scheduler routes to. Set pod,vm on a scheduler whose vm worker runs in another process; a job asking for a tier not listed is failed with a clear message."},
	{"STATE_DIR", "$HOME/.local/state/dynrunner", "State directory: embedded JetStream store, generated keys, development CA, local environments."},
	{"LOG_FORMAT", "json", "json, or console for humans."},
	{"LOG_LEVEL", "info", "trace, debug, info, warn or error."},
	{"HTTP_LISTEN", "127.0.0.1:9464", "Address of /healthz, /readyz and /metrics."},
	{"NATS_URL", "", "External NATS server or cluster (nats://host:4222,...). Empty: an embedded nats-server with JetStream under STATE_DIR/jetstream."},
	{"NATS_EMBEDDED_LISTEN", "127.0.0.1:4222", "Loopback address where the embedded NATS also listens, so operators can tail the audit subjects (user dynrunner, password in STATE_DIR/nats.password). off: in-process only."},
	{"NATS_USER", "", "User for NATS_URL; requires NATS_PASSWORD_FILE."},
	{"NATS_PASSWORD_FILE", "", "File holding the NATS password (mode 0600); requires NATS_USER."},
	{"NATS_REPLICAS", "1", "Replicas of dynrunner's streams and buckets (3 on a cluster)."},
	{"GITEA_URL", "", "Gitea base URL. Required with the scheduler or the facade."},
	{"GITEA_RUNNER_UUID_FILE", "", "File holding the resident runner's UUID; set together with GITEA_RUNNER_TOKEN_FILE."},
	{"GITEA_RUNNER_TOKEN_FILE", "", "File holding the resident runner's token."},
	{"GITEA_RUNNER_REGISTRATION_TOKEN_FILE", "", "File holding a runner registration token: registers on first start and keeps the credentials in STATE_DIR/gitea-runner.json (0600)."},
	{"GITEA_RUNNER_NAME", "dynrunner-<hostname>", "Name of the resident runner in Gitea."},
	{"GITEA_RUNNER_BIN", "", "The pinned Gitea runner binary local environments and microVMs run. Required with the pod worker (local backend) and the vm worker; docker environments run the copy in the executor image."},
	{"GITEA_RUNNER_SHA256", "", "SHA-256 of GITEA_RUNNER_BIN; executors refuse any other binary. Required with GITEA_RUNNER_BIN."},
	{"GITEA_RUNNER_VERSION", "v1.0.8", "Version GITEA_RUNNER_BIN must report."},
	{"RUNNER_FACADE_LISTEN", "127.0.0.1:8443", "Address the facade listens on (mTLS only)."},
	{"RUNNER_FACADE_URL", "https://<RUNNER_FACADE_LISTEN>", "URL environments reach the facade at."},
	{"RUNNER_FACADE_SPIFFE_ID", "spiffe://<SPIFFE_TRUST_DOMAIN>/dynrunner/facade", "SPIFFE ID the facade presents and environments expect."},
	{"RUNNER_FACADE_CAPABILITY_KEY_FILE", "STATE_DIR/capability.key (embedded NATS only)", "HMAC key (at least 32 bytes) for single-use capability tokens. Generated on first start with the embedded NATS; required with NATS_URL so replicas share it."},
	{"TASK_ENCRYPTION_KEY_FILE", "STATE_DIR/task.key (embedded NATS only)", "AES-256-GCM key sealing tasks (secrets, tokens) at rest in JetStream. Generated with the embedded NATS; required with NATS_URL."},
	{"SPIFFE_TRUST_DOMAIN", "dynrunner.local", "Trust domain of facade and environment SPIFFE IDs."},
	{"SPIFFE_ENDPOINT_SOCKET", "", "SPIFFE Workload API socket (unix:///run/spire/agent.sock). Unset: a development CA in STATE_DIR/ca issues SVIDs (logged loudly as development-only). The docker backend does not mount the socket into containers yet, so it is refused with POD_BACKEND=docker."},
	{"POD_BACKEND", "local", "Pod backend: local (executor child processes) or docker (one hardened container per job). kubernetes is not part of this release."},
	{"POD_EXECUTOR_IMAGE", "", "Executor image of the docker backend, pinned by digest (sha256:<64 hex> or name@sha256:<64 hex>; a tag is refused). scripts/executor-image.sh builds it and prints its ID."},
	{"POD_DOCKER_SOCKET", "/var/run/docker.sock", "Docker Engine API socket."},
	{"POD_DOCKER_NETWORK", "host", "Network of job containers. host lets them reach a loopback facade and Gitea; use a bridge network with a routable RUNNER_FACADE_URL to isolate them."},
	{"POD_DOCKER_PRIVILEGED", "false", "Run job containers privileged (Docker-in-Docker, BuildKit). Opt-in only: a privileged container can take over the host."},
	{"POD_DOCKER_MEMORY_MIB", "4096", "Memory limit of each job container (swap included)."},
	{"POD_DOCKER_CPUS", "2", "CPU limit of each job container."},
	{"POD_DOCKER_PIDS", "4096", "Process limit of each job container."},
	{"POD_DOCKER_USER", "1000:1000 (0:0 when privileged)", "Numeric uid:gid jobs run as."},
	{"POD_DOCKER_SCOPE", "default", "Label value separating the containers of controllers sharing one Docker engine."},
	{"POD_CONCURRENCY", "4", "Pod environments running at once."},
	{"VM_CONCURRENCY", "1", "VM environments running at once (with the vm worker)."},
	{"VM_BACKEND", "local", "VM backend: local (dynrunner launcher on this host) or opensandbox (the OpenSandbox Lifecycle API, pool OPENSANDBOX_POOL)."},
	{"VM_IMAGE", "", "Base image (qcow2 or raw) every microVM's root disk is converted from. Enables the vm worker with COMPONENTS=all."},
	{"VM_KERNEL", "", "Kernel for direct kernel boot (the test tier); empty: the hypervisor boots the disk with VM_FIRMWARE."},
	{"VM_INITRAMFS", "", "Initramfs for direct kernel boot."},
	{"VM_CMDLINE", "", "Kernel command line for direct kernel boot."},
	{"VM_FIRMWARE", "", "Firmware Cloud Hypervisor boots the disk with (e.g. hypervisor-fw)."},
	{"VM_HYPERVISOR", "cloud-hypervisor", "cloud-hypervisor, or qemu where Cloud Hypervisor cannot run (nested virtualization, tests: TCG)."},
	{"VM_CPUS", "2", "vCPUs per microVM."},
	{"VM_MEMORY_MIB", "2048", "Memory per microVM."},
	{"VM_DISK_GIB", "20", "Virtual size of each microVM's root disk."},
	{"VM_BRIDGE", "dynrunner0", "Bridge the microVMs' TAP devices attach to."},
	{"VM_BRIDGE_CIDR", "10.213.0.1/24", "The bridge's own address and network; guests get addresses in it."},
	{"VM_NONCE_LISTEN", "<bridge address>:7001", "Nonce endpoint; always on the bridge address, never a wildcard."},
	{"RUNNER_FACADE_GUEST_LISTEN", "<bridge address>:8444", "Facade listener for microVM guests (server-authenticated TLS; guests authenticate with single-use tokens; vm assignments only)."},
	{"RUNNER_FACADE_GUEST_URL", "https://<RUNNER_FACADE_GUEST_LISTEN>", "URL guests reach the facade's guest listener at."},
	{"OPENSANDBOX_URL", "", "OpenSandbox server (http(s)://host[:port][/v1]). Required with VM_BACKEND=opensandbox."},
	{"OPENSANDBOX_API_KEY_FILE", "", "File holding the OpenSandbox API key (sent as OPEN-SANDBOX-API-KEY). Required with VM_BACKEND=opensandbox."},
	{"OPENSANDBOX_POOL", "ci-vm", "Pool sandboxes are taken from (extensions.poolRef)."},
	{"OPENSANDBOX_IMAGE", "", "Image of the sandbox; empty: the pool's."},
	{"OPENSANDBOX_SCOPE", "default", "Label value separating the sandboxes of controllers sharing one OpenSandbox server."},
	{"OPENSANDBOX_SANDBOX_TTL", "6h", "Lifetime the server gives a sandbox (1m to 24h)."},
	{"OPENSANDBOX_START_TIMEOUT", "60s", "A sandbox not Running within this is failed and deleted; below PICKUP_SECS."},
	{"OPENSANDBOX_REQUEST_TIMEOUT", "30s", "Timeout of each API request."},
	{"OPENSANDBOX_SANDBOX_CIDR", "", "Network sandboxes connect from; the nonce endpoint and the facade's guest listener serve only it. Required with VM_BACKEND=opensandbox."},
	{"OPENSANDBOX_NONCE_URL", "http://<VM_NONCE_LISTEN>", "URL sandboxes reach the nonce endpoint at."},
	{"VM_LAUNCHER_ROOT", "STATE_DIR/vms", "Directory of the launchers' per-VM directories (must support O_DIRECT: ext4 or xfs, not tmpfs)."},
	{"LEASE_SECS", "300", "Lease of an assignment; environments renew it every LEASE_SECS/3. Floor 90."},
	{"PICKUP_SECS", "120", "A claim whose environment has not fetched the task within this is failed. Floor 60, below LEASE_SECS."},
	{"KEEPALIVE_SECS", "60", "How often a task whose environment is starting is reported alive to Gitea (which fails tasks silent for 10 minutes)."},
	{"FETCH_INTERVAL", "1s", "Pause between empty FetchTask polls (Go duration); errors back off to 10x."},
}

// Executor variables, set by the pod worker for each environment.
var ExecutorVars = []Var{
	{"DYNRUNNER_FACADE_URL", "", "Facade URL (https)."},
	{"DYNRUNNER_FACADE_SPIFFE_ID", "", "SPIFFE ID the facade must present."},
	{"DYNRUNNER_TASK_ID", "", "Forge task id of the assignment."},
	{"DYNRUNNER_EPOCH", "", "Fencing epoch of the assignment."},
	{"DYNRUNNER_SECRETS_DIR", "", "Directory with the capability token (and, without a Workload API, the SVID files)."},
	{"DYNRUNNER_WORK_DIR", "", "Work directory of the runner and the job."},
	{"DYNRUNNER_LABELS", "self-hosted:host,pod:host", "Labels the runner declares (name:host,...)."},
	{"DYNRUNNER_RENEW_SECS", "100", "Lease renewal interval."},
	{"SPIFFE_ENDPOINT_SOCKET", "", "Workload API socket; unset: SVID files in DYNRUNNER_SECRETS_DIR."},
	{"LOG_FORMAT", "json", "json, or console for humans."},
	{"GITEA_RUNNER_BIN", "", "The pinned Gitea runner."},
	{"GITEA_RUNNER_SHA256", "", "Its SHA-256."},
	{"GITEA_RUNNER_VERSION", "", "The version it must report."},
}
