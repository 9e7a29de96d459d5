// Package kubetest runs a real Kubernetes control plane for tests, and a test kubelet that runs
// Pods as Docker containers.
//
// # Control plane
//
// Start runs etcd and kube-apiserver (the versions scripts/k8s-tools.sh builds and caches; it
// skips the test with that command when they are missing, and fails it when CI is set) on free
// loopback ports with their files in t.TempDir(), and returns once /readyz answers ok (within
// two minutes; about 10 to 25 seconds on two cores). The apiserver has:
//
//   - a certificate authority of its own that signs its serving certificate (Cluster.Config
//     verifies it), the kubelet's serving certificate and its client certificate for the
//     kubelet, so logs flow over verified TLS both ways;
//   - static token authentication: AdminUser in system:masters (Cluster.Config, Cluster.Client,
//     Cluster.Kubeconfig) and User with no rights until a test binds a Role to it
//     (Cluster.UserConfig), to test the RBAC rules a component documents;
//   - RBAC authorization, --allow-privileged, service-account signing keys generated per
//     cluster, and the default admission plugins (ServiceAccount included: Cluster.Namespace
//     creates a namespace with its default ServiceAccount, and Start creates the one of
//     "default").
//
// No kube-controller-manager and no scheduler run: ownerReferences are not garbage-collected,
// namespaces are never finalized, ServiceAccounts and their tokens are not created, Pods are
// not scheduled (they must name their node in spec.nodeName), nodes are never marked
// NotReady and nothing evicts.
//
// Cluster.InstallCRDs creates CustomResourceDefinitions from a file and waits until they are
// served; KEDACRD finds KEDA's in the same cache (scripts/k8s-tools.sh keda-crds), for tests
// that submit KEDA objects.
//
// # Kubelet
//
// StartKubelet registers a Node (Ready, InternalIP 127.0.0.1, the port of its API) and plays
// its kubelet on the Docker engine at DockerSocket: it watches the Pods bound to the node and
// for each runs its container, reports the Pod Running with a container status, then Succeeded
// (exit code 0) or Failed with the exit code, and serves the container's log to the
// apiserver (pods/log: tailLines, limitBytes, follow, timestamps, sinceSeconds). When a Pod is
// deleted it stops the container with SIGTERM and the Pod's grace period, reports it Failed (or
// Succeeded when the container exited 0), removes the Pod from the API and the container from
// the engine; a Pod deleted at once (grace 0) just loses its container. activeDeadlineSeconds
// is enforced (the container is killed, the Pod Failed with reason DeadlineExceeded).
//
// The container gets: the image (the Kubelet never pulls: name@sha256:<hex> runs the local
// image whose ID is sha256:<hex>, see TestBinaryImage), command and args, env values and the
// fieldRefs that name the Pod, the working directory, memory and CPU limits, privileged (on a
// host that lacks capabilities itself, such as a sandbox without CAP_SYS_RESOURCE, runc cannot
// start privileged containers: they get every capability the host has, seccomp and AppArmor
// unconfined and /proc unmasked instead, but no host devices), runAsUser/runAsGroup, fsGroup and supplemental groups as extra groups,
// readOnlyRootFilesystem, allowPrivilegeEscalation=false as no-new-privileges, capabilities to
// add and drop. Volumes: emptyDir as a host directory of mode 0777 bind-mounted (medium Memory: a
// tmpfs, sizeLimit its size, each mount one of its own, except in a Pod with init containers,
// where it is a host directory as on disk, shared by the containers; no size limit on disk), secret as plain files in a host directory bind-mounted read-only (modes
// from defaultMode or items, with fsGroup the group and group read access; no ..data symlinks,
// no updates after the start), csi of a driver KubeletConfig.CSIDrivers maps to a host
// directory as a bind mount (any other driver never mounts: the Pod stays Pending, as on a
// node without the driver), hostPath as a bind mount. The test process must therefore run on
// the Docker host.
//
// Init containers run one after the other, each to its end, before the container, and are
// removed once ended; the Pod stays Pending meanwhile (no status of them while they run), and
// one that fails fails the Pod (its init container status terminated, its container waiting
// PodInitializing).
//
// Not emulated: more than one container, sidecar (restartable init) and ephemeral containers
// (such a Pod is refused with a waiting reason, never run); the deletion of a Pod while its
// init containers run waits for them; restart policies other than Never (a container is never
// restarted); probes, lifecycle hooks, ports, resource requests and QoS, pod-level resources;
// envFrom, valueFrom other than fieldRef, the service environment variables, configMap,
// projected and every other volume type, subPath; the pod network (containers share the
// Docker network KubeletConfig.Network, "host" by default; the Pod IP is reported as
// 127.0.0.1), DNS, hostname; image pulls and image pull secrets; seccomp, AppArmor, SELinux,
// user namespaces; node status heartbeats, leases, evictions, preemption, admission of
// resources; exec, attach, port-forward and metrics. A Pod the Kubelet cannot run stays
// Pending with a container status that says why.
package kubetest
