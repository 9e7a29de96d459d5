// Package kube is the pod worker's "kubernetes" backend: each job's environment is one
// one-shot Pod in a namespace of a Kubernetes cluster, created and watched with client-go.
//
// # Pods
//
// One Pod per environment, named "dynrunner-<task>-<epoch>" (Handle.ID), labelled
// app.kubernetes.io/managed-by=dynrunner, app.kubernetes.io/component=executor,
// dynrunner.io/task and dynrunner.io/epoch, and annotated with the JetStream subject of its
// assignment's event log (dynrunner.io/assignment-subject). Its only container, "executor",
// runs Config.Image, which must be pinned by digest (name@sha256:<64 hex>; a tag is refused,
// so every job runs exactly the image that was reviewed). The Pod has restartPolicy Never,
// activeDeadlineSeconds (Config.ActiveDeadline, 6 hours by default), the termination grace
// period Config.Grace, CPU and memory requests and limits (Config.Resources), the service
// account Config.ServiceAccount with its token not mounted, and no service links.
//
// By default the executor runs privileged and as root: the workflow runs in host mode and
// sets up Docker, BuildKit or kind itself. The apiserver must allow privileged Pods
// (--allow-privileged, on in kubeadm clusters) and the namespace's Pod Security admission must
// be "privileged" (label pod-security.kubernetes.io/enforce=privileged). With
// Config.Privileged set to false the container runs as 1000:1000 (runAsNonRoot, fsGroup 1000)
// with every capability dropped, allowPrivilegeEscalation false, a read-only root file system
// and the RuntimeDefault seccomp profile, which passes the "restricted" Pod Security level.
//
// Spec.Env becomes the container's environment, followed by the backend's own variables
// (DYNRUNNER_SECRETS_DIR=SecretsDir, DYNRUNNER_WORK_DIR=WorkDir, HOME=HomeDir, TMPDIR=/tmp,
// and SPIFFE_ENDPOINT_SOCKET with Config.SpiffeCSI), which win. WorkDir, HomeDir and /tmp are
// emptyDir volumes. Spec.Files go into a Secret of the Pod's name, mounted read-only at
// SecretsDir with mode 0600 (0640, group fsGroup, for unprivileged Pods). The Secret is created
// first and then owned by the Pod through an ownerReference, so the cluster's garbage
// collector removes it with the Pod; Destroy deletes it explicitly as well.
//
// A GitHub slot's Pod (executor.IsGitHub of Spec.Env) differs in three ways. A Secret volume
// is read-only, and the slot's executor removes the JIT configuration from its secrets
// directory once read, before the runner and the job start: so the Secret is mounted only
// into an init container, InitContainerName, which copies its files (CopyCommand, the
// executor image's cp, at SecretsSourceDir) into a memory-backed emptyDir that the executor's
// container mounts writable at SecretsDir. The executor's container never mounts the Secret.
// The init container runs the executor image unprivileged, without capabilities and with a
// read-only root, as the executor's user (root in a privileged Pod, whose Secret files are
// root's). The Pod gets no SPIFFE CSI volume and no SPIFFE_ENDPOINT_SOCKET: the slot's runner
// talks to GitHub, not to the facade. HOME is an emptyDir as in every Pod, where the image's
// GitHub launcher copies the runner.
//
// With Config.SpiffeCSI the SPIFFE Workload API socket comes from the spiffe-csi-driver
// (csi.spiffe.io), mounted read-only at SpireSocketDir, and SPIFFE_ENDPOINT_SOCKET points at
// its agent.sock; the SPIRE agent attests the Pod by its UID, which Handle.Data records
// ("pod_uid") and the worker writes to the event log.
//
// # Lifecycle
//
// Start is idempotent for a task and epoch: a Pod of that name that has not ended is returned
// as is (a retried dispatch, a concurrent Start of another controller replica); one that ended
// or is being deleted is removed with its Secret and created afresh. Wait reads the Pod and
// then watches it from that resource version, resuming after watch timeouts, expired resource
// versions and apiserver restarts, until the Pod ends; the exit code comes from the
// container's terminated state, the reason from the container and Pod status ("exited",
// "oom", "deadline", "evicted", "deleted"). A Pod that is deleted while Wait watches ends Wait
// with reason "deleted"; once it is gone Wait returns an error wrapping podworker.ErrNotFound.
// Handles recovered after a restart behave the same. Wait reports every phase change it sees
// (Pending, Running, Succeeded, Failed, and Deleted for a Pod deleted under it) to
// Config.OnPhase, which the controller appends to the event log. Notify, which the pod worker
// uses (podworker.Await), reports the same ends and phases without a goroutine or a watch per
// environment: one informer on the backend's Pods (Selector) serves every registration, from
// the first Notify until none is left. A Pod that cannot start
// (image pull failures, a missing CSI driver) stays Pending: Wait returns only at the
// deadline, and the worker's pickup timeout destroys it before.
//
// Destroy deletes the Pod with the grace period (the kubelet sends SIGTERM, then SIGKILL) and
// its Secret, and waits until the Pod is gone, at most the grace period plus a minute. It is
// idempotent, leaves objects without the backend's labels alone (ErrNotManaged), and leaves a
// newer Pod of the same name than the handle's alone. List reports the backend's Pods in the
// namespace and, as handles with nil Data, its Secrets without a Pod (a crash between the
// two creations), for the worker to adopt or reap. One dynrunner installation per namespace.
//
// Diagnose reads the tail of the container's log through pods/log; see its documentation
// for why it cannot separate stderr from stdout on Kubernetes.
//
// The permissions the backend needs in its namespace are RBACRules; Check verifies them at
// boot with SelfSubjectAccessReviews (which every authenticated user may create).
package kube
