package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/rs/zerolog"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/podworker"
)

const backendName = "kubernetes"

// Defaults for the optional Config fields.
const (
	DefaultCPURequest     = "1"
	DefaultCPULimit       = "2"
	DefaultMemoryRequest  = "2Gi"
	DefaultMemoryLimit    = "4Gi"
	DefaultActiveDeadline = 6 * time.Hour
	DefaultGrace          = 30 * time.Second
)

// Paths inside every environment's container.
const (
	// SecretsDir holds Spec.Files, read-only (DYNRUNNER_SECRETS_DIR); in a GitHub slot's Pod
	// a writable copy of them.
	SecretsDir = "/run/dynrunner/secrets"
	// SecretsSourceDir is where a GitHub slot's init container, and it alone, mounts the Secret.
	SecretsSourceDir = "/run/dynrunner/secret-volume"
	// CopyCommand is the init container's command: the executor image's cp (coreutils).
	CopyCommand = "/bin/cp"
	// WorkDir is the executor's working directory, an emptyDir (DYNRUNNER_WORK_DIR).
	WorkDir = "/work"
	// HomeDir is HOME, an emptyDir.
	HomeDir = "/home/runner"
	// TmpDir is TMPDIR, an emptyDir.
	TmpDir = "/tmp"
	// SpireSocketDir is where the SPIFFE CSI driver's volume is mounted (Config.SpiffeCSI).
	SpireSocketDir = "/run/spire/sockets"
	// SpiffeEndpointSocket is the executor's SPIFFE_ENDPOINT_SOCKET with Config.SpiffeCSI.
	SpiffeEndpointSocket = "unix://" + SpireSocketDir + "/agent.sock"
	// RunnerBin is where the executor image (deploy/executor-image) keeps the pinned Gitea
	// runner: the GITEA_RUNNER_BIN of kubernetes environments.
	RunnerBin = "/usr/local/bin/gitea-runner"
)

// SpiffeCSIDriver is the CSI driver that provides the SPIFFE Workload API socket
// (spiffe-csi-driver).
const SpiffeCSIDriver = "csi.spiffe.io"

// Labels and annotations on every Pod and Secret the backend creates.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "dynrunner"
	LabelComponent = "app.kubernetes.io/component"
	Component      = "executor"
	LabelTask      = "dynrunner.io/task"
	LabelEpoch     = "dynrunner.io/epoch"
	// AnnotationAssignment names the JetStream subject of the assignment's event log, where
	// `nats stream view` shows its history.
	AnnotationAssignment = "dynrunner.io/assignment-subject"
)

// ContainerName is the name of the executor's container in every Pod.
const ContainerName = "executor"

// InitContainerName is the name of a GitHub slot's init container, which copies the Secret
// into the slot's secrets directory.
const InitContainerName = "secrets"

// Keys of Handle.Data.
const dataPodUID = "pod_uid"

// Sentinel errors; callers branch on them with errors.Is.
var (
	// ErrInvalidConfig reports a Config New refuses.
	ErrInvalidConfig = errors.New("kube: invalid configuration")
	// ErrInvalidSpec reports a Spec the backend refuses (bad task or epoch, unsafe secret file
	// name, malformed environment variable); retrying cannot help.
	ErrInvalidSpec = errors.New("kube: invalid spec")
	// ErrInvalidHandle reports a Handle that is not a kubernetes one or names no valid Pod.
	ErrInvalidHandle = errors.New("kube: invalid handle")
	// ErrNotManaged reports a Pod or Secret that has an environment's name but not the
	// backend's labels; the backend never touches it.
	ErrNotManaged = errors.New("kube: object not managed by dynrunner")
)

// Resources are the executor container's requests and limits, as Kubernetes quantities
// ("500m", "2", "4Gi"). Empty fields take the defaults.
type Resources struct {
	CPURequest    string // DefaultCPURequest when empty
	CPULimit      string // DefaultCPULimit when empty
	MemoryRequest string // DefaultMemoryRequest when empty
	MemoryLimit   string // DefaultMemoryLimit when empty
}

// Config configures a Backend. The caller fills it; the backend reads no environment variables.
type Config struct {
	// Client talks to the cluster (in-cluster configuration or a kubeconfig, the caller's
	// choice).
	Client kubernetes.Interface
	// Namespace holds the Pods and Secrets. One dynrunner installation per namespace: List
	// reports, and the worker reaps, every dynrunner Pod in it.
	Namespace string
	// Image is the executor image pinned by digest: name@sha256:<64 hex>. A tag is refused.
	Image string
	// NodeName, when set, binds every Pod to that node, bypassing the scheduler (tests).
	NodeName string
	// Resources are the container's requests and limits.
	Resources Resources
	// ActiveDeadline bounds a Pod's life (activeDeadlineSeconds; DefaultActiveDeadline when
	// zero, whole seconds rounded up).
	ActiveDeadline time.Duration
	// Grace is the Pod's termination grace period, which Destroy gives the executor after
	// SIGTERM (DefaultGrace when zero, whole seconds rounded up).
	Grace time.Duration
	// ServiceAccount is the Pods' service account ("default" when empty). Its token is never
	// mounted: the executor does not talk to the Kubernetes API.
	ServiceAccount string
	// ImagePullSecrets name Secrets in Namespace that authenticate the image pull.
	ImagePullSecrets []string
	// SpiffeCSI mounts the SPIFFE Workload API socket from the csi.spiffe.io CSI driver at
	// SpireSocketDir and sets SPIFFE_ENDPOINT_SOCKET=SpiffeEndpointSocket in the container.
	SpiffeCSI bool
	// Privileged runs the executor privileged and as root (nil: true, the design's default:
	// the workflow runs in host mode and sets up Docker, BuildKit or kind itself). With false
	// the container runs as 1000:1000 with every capability dropped, no privilege escalation,
	// a read-only root file system and the RuntimeDefault seccomp profile.
	Privileged *bool
	// OnPhase, when set, is called by Wait with every phase change of the Pod it watches (see
	// PhaseChange), synchronously and in order, with Wait's ctx. It must return quickly (bound
	// its I/O with a timeout) and handle its errors itself: Wait waits for it. Notify calls it
	// the same way, in order for each Pod and before the registration's ended, from a
	// goroutine of the registration's (never the shared informer's), with the shared
	// informer's ctx, which is done only once every registration's calls have returned.
	OnPhase func(ctx context.Context, h podworker.Handle, c PhaseChange)
	// Log receives the backend's events.
	Log zerolog.Logger
}

// Backend runs each environment as a Kubernetes Pod. It is safe for concurrent use, and
// several Backends (in one process or in successive controller processes) may share a
// namespace.
type Backend struct {
	client           kubernetes.Interface
	ns               string
	image            string
	node             string
	cpuReq, cpuLim   resource.Quantity
	memReq, memLim   resource.Quantity
	deadline         int64 // seconds
	grace            int64 // seconds
	serviceAccount   string
	imagePullSecrets []string
	spiffeCSI        bool
	privileged       bool
	onPhase          func(context.Context, podworker.Handle, PhaseChange)
	log              zerolog.Logger
	notifier         notifier // Notify's registrations and shared informer
}

var _ podworker.Backend = (*Backend)(nil)

var imageDigestRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$`)

// New validates cfg and returns a Backend. It does not contact the cluster.
func New(cfg Config) (*Backend, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	if cfg.Client == nil {
		bad("no Kubernetes client")
	}
	if msgs := validation.IsDNS1123Label(cfg.Namespace); len(msgs) > 0 {
		bad("namespace %q: %v", cfg.Namespace, msgs)
	}
	if !imageDigestRe.MatchString(cfg.Image) {
		bad("image %q is not pinned by digest: want name@sha256:<64 hex>", cfg.Image)
	}
	if cfg.NodeName != "" {
		if msgs := validation.IsDNS1123Subdomain(cfg.NodeName); len(msgs) > 0 {
			bad("node name %q: %v", cfg.NodeName, msgs)
		}
	}
	quantity := func(what, v, def string) resource.Quantity {
		q, err := resource.ParseQuantity(cmp.Or(v, def))
		if err != nil || q.Sign() <= 0 {
			bad("%s %q: want a positive Kubernetes quantity", what, v)
		}
		return q
	}
	r := cfg.Resources
	b := &Backend{
		client:           cfg.Client,
		ns:               cfg.Namespace,
		image:            cfg.Image,
		node:             cfg.NodeName,
		cpuReq:           quantity("CPU request", r.CPURequest, DefaultCPURequest),
		cpuLim:           quantity("CPU limit", r.CPULimit, DefaultCPULimit),
		memReq:           quantity("memory request", r.MemoryRequest, DefaultMemoryRequest),
		memLim:           quantity("memory limit", r.MemoryLimit, DefaultMemoryLimit),
		serviceAccount:   cmp.Or(cfg.ServiceAccount, "default"),
		imagePullSecrets: cfg.ImagePullSecrets,
		spiffeCSI:        cfg.SpiffeCSI,
		privileged:       cfg.Privileged == nil || *cfg.Privileged,
		onPhase:          cfg.OnPhase,
	}
	if b.cpuReq.Cmp(b.cpuLim) > 0 {
		bad("CPU request %s above the limit %s", b.cpuReq.String(), b.cpuLim.String())
	}
	if b.memReq.Cmp(b.memLim) > 0 {
		bad("memory request %s above the limit %s", b.memReq.String(), b.memLim.String())
	}
	if msgs := validation.IsDNS1123Subdomain(b.serviceAccount); len(msgs) > 0 {
		bad("service account %q: %v", cfg.ServiceAccount, msgs)
	}
	for _, s := range cfg.ImagePullSecrets {
		if msgs := validation.IsDNS1123Subdomain(s); len(msgs) > 0 {
			bad("image pull secret %q: %v", s, msgs)
		}
	}
	switch {
	case cfg.ActiveDeadline < 0:
		bad("negative active deadline %v", cfg.ActiveDeadline)
	case cfg.Grace < 0:
		bad("negative grace period %v", cfg.Grace)
	}
	b.deadline = ceilSeconds(cmp.Or(cfg.ActiveDeadline, DefaultActiveDeadline))
	b.grace = ceilSeconds(cmp.Or(cfg.Grace, DefaultGrace))
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	b.log = cfg.Log.With().Str(logkey.Backend, backendName).Str("namespace", b.ns).Logger()
	return b, nil
}

// Name returns "kubernetes".
func (b *Backend) Name() string { return backendName }

// envLog returns the backend's logger with the fields that identify environment h.
func (b *Backend) envLog(h podworker.Handle) *zerolog.Logger {
	c := b.log.With().Str(logkey.Env, h.ID)
	if h.Task != 0 {
		c = c.Int64(logkey.TaskID, int64(h.Task)).Uint64(logkey.Epoch, uint64(h.Epoch))
	}
	if uid := h.Data[dataPodUID]; uid != "" {
		c = c.Str(dataPodUID, uid)
	}
	l := c.Logger()
	return &l
}

func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
