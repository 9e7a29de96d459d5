package docker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/podworker"
)

const backendName = "docker"

// Defaults for the optional Config fields.
const (
	DefaultSocket  = "/var/run/docker.sock"
	DefaultNetwork = "dynrunner"
	DefaultMemory  = 4 << 30 // bytes
	DefaultCPUs    = 2.0
	DefaultPids    = 4096
	DefaultUser    = "1000:1000"
	DefaultScope   = "default"
	DefaultGrace   = 10 * time.Second
)

// Paths inside every environment's container.
const (
	// SecretsDir holds Spec.Files, read-only (DYNRUNNER_SECRETS_DIR).
	SecretsDir = "/run/dynrunner/secrets"
	// WorkDir is the executor's working directory, a tmpfs (DYNRUNNER_WORK_DIR).
	WorkDir = "/work"
	// HomeDir is HOME, a tmpfs.
	HomeDir = "/home/runner"
	// TmpDir is TMPDIR, a tmpfs.
	TmpDir = "/tmp"
	// SpiffeSocketDir is where the directory of Config.SpiffeSocket is mounted, read-only.
	SpiffeSocketDir = "/run/spire/sockets"
	// RunnerBin is where the executor image (deploy/executor-image) keeps the pinned Gitea
	// runner: the GITEA_RUNNER_BIN of docker environments.
	RunnerBin = "/usr/local/bin/gitea-runner"
)

// Labels on every container the backend creates, and on the executor image.
const (
	LabelManaged = "dynrunner.managed"
	LabelScope   = "dynrunner.scope"
	LabelTask    = "dynrunner.task"
	LabelEpoch   = "dynrunner.epoch"
	// LabelRunnerSHA256 is the executor image's label naming the SHA-256 of its Gitea runner
	// (scripts/executor-image.sh sets it); see ImageLabels.
	LabelRunnerSHA256 = "dynrunner.gitea-runner.sha256"
)

// Keys of Handle.Data.
const dataContainerID = "container_id"

// Names inside StateDir.
const (
	secretsSub = "secrets"
	locksDir   = ".locks"
)

// minMemory is the smallest memory limit New accepts; the executor and the runner need more.
const minMemory = 64 << 20

// Sentinel errors; callers branch on them with errors.Is.
var (
	// ErrInvalidConfig reports a Config New refuses.
	ErrInvalidConfig = errors.New("docker: invalid configuration")
	// ErrInvalidSpec reports a Spec the backend refuses (bad task or epoch, unsafe secret file
	// name, malformed environment variable); retrying cannot help.
	ErrInvalidSpec = errors.New("docker: invalid spec")
	// ErrInvalidHandle reports a Handle that is not a docker one or names no safe container.
	ErrInvalidHandle = errors.New("docker: invalid handle")
	// ErrNotManaged reports a container that has an environment's name but was not created by
	// this backend's scope; the backend never touches it.
	ErrNotManaged = errors.New("docker: container not managed by dynrunner")
	// ErrEngineTooOld reports an engine older than Docker 20.10 (API 1.41).
	ErrEngineTooOld = errors.New("docker: engine too old")
	// ErrImageMissing reports an executor image the engine does not have (Check).
	ErrImageMissing = errors.New("docker: executor image missing")
	// ErrRunnerMismatch reports an executor image whose LabelRunnerSHA256 names another Gitea
	// runner than Config.RunnerSHA256 (Check).
	ErrRunnerMismatch = errors.New("docker: executor image holds another Gitea runner")
)

// Config configures a Backend. The caller fills it; the backend reads no environment variables.
type Config struct {
	// Socket is the engine's unix socket (DefaultSocket when empty); "unix://" is accepted.
	Socket string
	// RunnerSHA256, when set, is the SHA-256 of the Gitea runner the environments must run
	// (hex): Check refuses an image whose LabelRunnerSHA256 names another. An image without
	// the label is not checked.
	RunnerSHA256 string
	// Image is the executor image, pinned by digest: a local image ID ("sha256:<64 hex>", as
	// scripts/executor-image.sh prints) or "name@sha256:<64 hex>". A tag alone is refused.
	Image string
	// Network is the containers' network (DefaultNetwork when empty): "host", or the name of a
	// network, which PrepareNetwork creates as an isolated bridge when it does not exist; see
	// the package documentation.
	Network string
	// Memory is each container's memory limit in bytes, swap included (DefaultMemory when
	// zero). It also bounds each tmpfs.
	Memory int64
	// CPUs is each container's CPU limit (DefaultCPUs when zero).
	CPUs float64
	// Pids is each container's process limit (DefaultPids when zero).
	Pids int64
	// Privileged runs containers privileged, as root: an explicit opt-in with the risks the
	// package documentation lists.
	Privileged bool
	// User is "uid:gid" the container runs as (DefaultUser, or "0:0" when Privileged, when
	// empty). A controller that is not root can only give the secret files to its own uid.
	User string
	// StateDir holds each environment's secrets directory and the lock files, for example
	// $STATE_DIR/docker-envs. It must be an absolute path the engine sees at the same path;
	// New creates it (mode 0700) when missing.
	StateDir string
	// Scope separates the containers of several dynrunner installations on one engine: List
	// reports only its own (DefaultScope when empty; lowercase letters and digits, at most 32).
	Scope string
	// Grace is how long Destroy lets the executor stop after SIGTERM before the engine kills it
	// (DefaultGrace when zero; whole seconds, rounded up).
	Grace time.Duration
	// SpiffeSocket, when set, is the host path of the SPIRE agent's Workload API socket
	// ("unix://" is accepted): its directory is mounted read-only at SpiffeSocketDir in every
	// container, whose SPIFFE_ENDPOINT_SOCKET then names the socket there. The agent's docker
	// workload attestor identifies a container by its labels (LabelScope, LabelTask,
	// LabelEpoch). Empty: the environments get their SVIDs as files only.
	SpiffeSocket string
	// Log receives the backend's events.
	Log zerolog.Logger
}

// Backend runs each environment as a Docker container. It is safe for concurrent use, and
// several Backends (in one process or in successive controller processes) may share an engine
// and a StateDir.
type Backend struct {
	eng        *engine
	image      string
	runnerSHA  string
	network    string
	memory     int64
	nanoCPUs   int64
	pids       int64
	privileged bool
	user       string
	uid, gid   int
	stateDir   string
	scope      string
	grace      time.Duration
	// spiffeSocket is Config.SpiffeSocket, without "unix://".
	spiffeSocket string
	log          zerolog.Logger
	// notes serves Notify.
	notes *notifier
}

var _ podworker.Backend = (*Backend)(nil)

var (
	imageIDRe     = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	imageDigestRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$`)
	networkRe     = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)
	scopeRe       = regexp.MustCompile(`^[a-z0-9]{1,32}$`)
	userRe        = regexp.MustCompile(`^([0-9]{1,10}):([0-9]{1,10})$`)
)

// New validates cfg and returns a Backend. It creates StateDir when missing but does not
// contact the engine; call Check at boot for that.
func New(cfg Config) (*Backend, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	socket := strings.TrimPrefix(cfg.Socket, "unix://")
	if socket == "" {
		socket = DefaultSocket
	}
	if !filepath.IsAbs(socket) {
		bad("socket %q: want the absolute path of the engine's unix socket", cfg.Socket)
	}
	if !imageIDRe.MatchString(cfg.Image) && !imageDigestRe.MatchString(cfg.Image) {
		bad("image %q is not pinned by digest: want sha256:<64 hex> (a local image ID, as scripts/executor-image.sh prints) or name@sha256:<64 hex>", cfg.Image)
	}
	network := cmp.Or(cfg.Network, DefaultNetwork)
	if !networkRe.MatchString(network) {
		bad("network %q: want a network name (host, bridge or a user-defined network)", cfg.Network)
	}
	memory := cfg.Memory
	if memory == 0 {
		memory = DefaultMemory
	}
	if memory < minMemory {
		bad("memory limit %d bytes: want at least %d", cfg.Memory, minMemory)
	}
	cpus := cfg.CPUs
	if cpus == 0 {
		cpus = DefaultCPUs
	}
	if cpus < 0.01 || math.IsNaN(cpus) || math.IsInf(cpus, 0) || cpus > 4096 {
		bad("CPU limit %v: want a positive number of CPUs", cfg.CPUs)
	}
	pids := cfg.Pids
	if pids == 0 {
		pids = DefaultPids
	}
	if pids < 16 {
		bad("pids limit %d: want at least 16", cfg.Pids)
	}
	user := cfg.User
	if user == "" {
		user = DefaultUser
		if cfg.Privileged {
			user = "0:0"
		}
	}
	uid, gid := -1, -1
	if m := userRe.FindStringSubmatch(user); m == nil {
		bad("user %q: want numeric uid:gid", cfg.User)
	} else {
		uid, _ = strconv.Atoi(m[1])
		gid, _ = strconv.Atoi(m[2])
		if euid := os.Geteuid(); euid != 0 && uid != euid {
			bad("user %s: the controller runs as uid %d and cannot give the secret files to uid %d; run it as root or set the user to %d:%d", user, euid, uid, euid, os.Getegid())
		}
	}
	scope := cmp.Or(cfg.Scope, DefaultScope)
	if !scopeRe.MatchString(scope) {
		bad("scope %q: want 1 to 32 lowercase letters and digits", cfg.Scope)
	}
	spiffeSocket := strings.TrimPrefix(cfg.SpiffeSocket, "unix://")
	if spiffeSocket != "" {
		spiffeSocket = filepath.Clean(spiffeSocket)
	}
	if spiffeSocket != "" && (!filepath.IsAbs(spiffeSocket) || filepath.Dir(spiffeSocket) == "/") {
		bad("SPIFFE socket %q: want the absolute path of the agent's socket, in a directory of its own", cfg.SpiffeSocket)
	}
	if cfg.Grace < 0 {
		bad("negative grace period %v", cfg.Grace)
	}
	if !filepath.IsAbs(cfg.StateDir) {
		bad("state directory %q: want an absolute path", cfg.StateDir)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	stateDir := filepath.Clean(cfg.StateDir)
	if err := os.MkdirAll(filepath.Join(stateDir, locksDir), 0o700); err != nil {
		return nil, fmt.Errorf("docker: state directory: %w", err)
	}
	if err := os.Chmod(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("docker: state directory: %w", err)
	}
	grace := cfg.Grace
	if grace == 0 {
		grace = DefaultGrace
	}
	eng, err := newEngine(socket)
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	b := &Backend{
		eng:          eng,
		image:        cfg.Image,
		runnerSHA:    cfg.RunnerSHA256,
		network:      network,
		memory:       memory,
		nanoCPUs:     int64(math.Round(cpus * 1e9)),
		pids:         pids,
		privileged:   cfg.Privileged,
		user:         user,
		uid:          uid,
		gid:          gid,
		stateDir:     stateDir,
		scope:        scope,
		grace:        grace,
		spiffeSocket: spiffeSocket,
		log:          cfg.Log.With().Str(logkey.Backend, backendName).Logger(),
	}
	b.notes = newNotifier(b)
	return b, nil
}

// Name returns "docker".
func (b *Backend) Name() string { return backendName }

// Close stops the event stream that serves Notify and releases the backend's idle connections
// to the engine. Environments keep running; a Notify registration still pending ends only with
// its stop. It is idempotent.
func (b *Backend) Close() error {
	b.notes.close()
	b.eng.close()
	return nil
}

// Check contacts the engine and checks that it is recent enough and holds the executor image,
// with the Gitea runner of Config.RunnerSHA256 (ErrRunnerMismatch). The controller calls it at
// boot, so a wrong socket, a missing image or the wrong runner is a boot error rather than a
// failed job.
func (b *Backend) Check(ctx context.Context) error {
	if _, err := b.eng.api(ctx); err != nil {
		return fmt.Errorf("docker: check: %w", err)
	}
	labels, err := b.ImageLabels(ctx)
	if err != nil {
		return fmt.Errorf("docker: check: %w", err)
	}
	if err := checkRunner(b.image, labels, b.runnerSHA); err != nil {
		return fmt.Errorf("docker: check: %w", err)
	}
	return nil
}

// checkRunner checks that the labels of image name the Gitea runner with SHA-256 want, when
// want is set and the image has the label.
func checkRunner(image string, labels map[string]string, want string) error {
	if sha := labels[LabelRunnerSHA256]; want != "" && sha != "" && sha != want {
		return fmt.Errorf("image %s holds a Gitea runner with SHA-256 %s, not %s: %w", image, sha, want, ErrRunnerMismatch)
	}
	return nil
}

// ImageLabels returns the labels of the executor image, for example LabelRunnerSHA256. It
// returns an error wrapping ErrImageMissing when the engine does not have the image.
func (b *Backend) ImageLabels(ctx context.Context) (map[string]string, error) {
	api, err := b.eng.api(ctx)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", b.image, err)
	}
	img, err := api.ImageInspect(ctx, b.image)
	if cerrdefs.IsNotFound(err) {
		return nil, fmt.Errorf("image %s: %w (build it with scripts/executor-image.sh on this host; no registry is pulled from)", b.image, ErrImageMissing)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", b.image, err)
	}
	if img.Config == nil {
		return nil, nil
	}
	return img.Config.Labels, nil
}

// envLog returns the backend's logger with the fields that identify environment h.
func (b *Backend) envLog(h podworker.Handle) *zerolog.Logger {
	c := b.log.With().Str(logkey.Env, h.ID)
	if h.Task != 0 {
		c = c.Int64(logkey.TaskID, int64(h.Task)).Uint64(logkey.Epoch, uint64(h.Epoch))
	}
	if id := h.Data[dataContainerID]; id != "" {
		c = c.Str("container", shortID(id))
	}
	l := c.Logger()
	return &l
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
