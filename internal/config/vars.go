// Package config loads dynrunner's configuration from the environment into plain structs and
// validates it, failing closed: a half-configured setting is a boot error that says what to
// set. Long-lived credentials are only ever read from files (*_FILE variables).
package config

import (
	"strconv"
	"strings"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Var documents one environment variable. docs/configuration.md lists every Var with its
// default; a test keeps the two in step.
type Var struct {
	Name    string
	Default string
	Doc     string
}

// Controller variables.
var ControllerVars = []Var{
	{"COMPONENTS", "all", "Comma-separated components to run: scheduler, facade, pod-worker, vm-worker. all = scheduler, facade and pod-worker, plus vm-worker when VM_IMAGE is set or VM_BACKEND=opensandbox."},
	{"TIERS", "pod (+ vm with the vm worker)", "Isolation tiers the scheduler routes to. Set pod,vm on a scheduler whose vm worker runs in another process; a job asking for a tier not listed is failed with a clear message."},
	{"STATE_DIR", "$HOME/.local/state/dynrunner", "State directory: embedded JetStream store, generated keys, development CA, local environments. Mode 0700; 0711 when local environments run under uids of their own."},
	{"LOG_FORMAT", "json", "json, or console for humans."},
	{"LOG_LEVEL", "info", "trace, debug, info, warn or error."},
	{"HTTP_LISTEN", "127.0.0.1:9464", "Address of /healthz, /readyz, /status and /metrics; dynrunner status reads it."},
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
	{"SPIFFE_ENDPOINT_SOCKET", "", "SPIFFE Workload API socket (unix:///run/spire/agent.sock). Unset: a development CA in STATE_DIR/ca issues SVIDs (logged loudly as development-only). With POD_BACKEND=docker it must be unix:///<dir>/<socket> on the host: the backend mounts <dir> read-only at /run/spire/sockets in every container (run `dynrunner identity` with IDENTITY_SOURCE=docker to register them)."},
	{"POD_BACKEND", "local", "Pod backend: local (executor child processes), docker (one hardened container per job) or kubernetes (one Pod per job, SVIDs from SPIRE)."},
	{"POD_LOCAL_UID_BASE", "2000000000", "With the local backend and a root controller: the first uid (and gid) of the range environments run as, one each."},
	{"POD_LOCAL_UID_COUNT", "65536", "Size of that range; at least POD_CONCURRENCY. Controllers of one host sharing the range get distinct uids."},
	{"POD_EXECUTOR_IMAGE", "", "Executor image of the docker backend, pinned by digest (sha256:<64 hex> or name@sha256:<64 hex>; a tag is refused). scripts/executor-image.sh builds it and prints its ID."},
	{"POD_NAMESPACE", "", "Namespace of the kubernetes backend's Pods and Secrets. Required with POD_BACKEND=kubernetes."},
	{"KUBECONFIG", "", "Kubeconfig of the kubernetes backend; empty: the in-cluster configuration."},
	{"POD_KUBE_CPU_REQUEST", "1", "CPU request of each job Pod."},
	{"POD_KUBE_CPU_LIMIT", "2", "CPU limit of each job Pod."},
	{"POD_KUBE_MEMORY_REQUEST", "2Gi", "Memory request of each job Pod."},
	{"POD_KUBE_MEMORY_LIMIT", "4Gi", "Memory limit of each job Pod."},
	{"POD_ACTIVE_DEADLINE", "6h", "activeDeadlineSeconds of each job Pod."},
	{"POD_KUBE_GRACE", "30s", "Termination grace period of each job Pod."},
	{"POD_SERVICE_ACCOUNT", "default", "Service account of job Pods (its token is not mounted)."},
	{"POD_IMAGE_PULL_SECRETS", "", "Comma-separated image pull secrets of job Pods."},
	{"POD_PRIVILEGED", "true", "Job Pods are privileged, so workflows set up Docker, BuildKit or kind themselves. false: non-root, no capabilities, read-only root."},
	{"POD_SPIFFE_CSI", "false", "Mount the SPIFFE Workload API into job Pods through the csi.spiffe.io driver. Required (true) with POD_BACKEND=kubernetes."},
	{"POD_DOCKER_SOCKET", "/var/run/docker.sock", "Docker Engine API socket (a path; a unix:// prefix is accepted)."},
	{"POD_DOCKER_NETWORK", "dynrunner", "Network of job containers. A name that does not exist is created as an isolated bridge (containers cannot reach each other; from it the host accepts only the facade, served on its gateway, and a forge on this host: nftables table inet dynrunner_<bridge>; needs root or CAP_NET_ADMIN and nft). host shares the host's network: jobs then reach every loopback service of the host, NATS and /metrics included. Another existing network is used as it is, unfirewalled."},
	{"POD_DOCKER_SUBNET", "", "IPv4 subnet of the job network when the controller creates it (for example 10.210.0.0/24; its first address is the gateway). Empty: the engine picks one."},
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
	{"VM_EGRESS", "none", "What microVM guests reach beyond the nonce endpoint and the facade's guest listener: none, or nat (masqueraded, to the forge and VM_EGRESS_ALLOW only). Set up with nftables by the controller (local vm backend)."},
	{"VM_EGRESS_ALLOW", "", "With VM_EGRESS=nat: comma-separated destinations guests may reach besides the forge (GITEA_URL's host and port, always allowed): IPV4[/PREFIX][:PORT] or HOSTNAME[:PORT] (resolved at start); no port: every port."},
	{"VM_DNS", "", "Comma-separated IPv4 name servers guests resolve with (allowed on port 53 with VM_EGRESS=nat); required when the forge or an allowed destination is a host name."},
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
	{executor.EnvFacadeURL, "", "Facade URL (https)."},
	{executor.EnvFacadeSpiffeID, "", "SPIFFE ID the facade must present."},
	{executor.EnvTaskID, "", "Forge task id of the assignment."},
	{executor.EnvEpoch, "", "Fencing epoch of the assignment."},
	{executor.EnvSecretsDir, "", "Directory with the capability token (and, without a Workload API, the SVID files)."},
	{executor.EnvWorkDir, "", "Work directory of the runner and the job."},
	{executor.EnvForgeURL, "", "The forge's own URL, the job's server URL (the assignment's forge_url)."},
	{executor.EnvLabels, strings.Join(executor.Labels(assignment.BackendPod), ","), "Labels the runner declares (name:host,...)."},
	{executor.EnvRenewSecs, strconv.Itoa(int(executor.DefaultRenew.Seconds())), "Lease renewal interval."},
	{executor.EnvSpiffeSocket, "", "Workload API socket; unset: SVID files in DYNRUNNER_SECRETS_DIR."},
	{executor.EnvLogFormat, executor.DefaultLogFormat, "json, or console for humans."},
	{executor.EnvRunnerBin, "", "The pinned Gitea runner."},
	{executor.EnvRunnerSHA256, "", "Its SHA-256."},
	{executor.EnvRunnerVersion, "", "The version it must report."},
}
