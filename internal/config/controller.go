package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/grants"
	"github.com/dynrunner/dynrunner/internal/liveness"
	"github.com/dynrunner/dynrunner/scheduler"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Component names for COMPONENTS.
const (
	Scheduler = "scheduler"
	Facade    = "facade"
	PodWorker = "pod-worker"
	VMWorker  = "vm-worker"
)

// Controller is the controller's configuration.
type Controller struct {
	Components []string
	StateDir   string
	LogFormat  string
	LogLevel   string
	HTTPListen string

	NATSURL          string
	NATSUser         string
	NATSPasswordFile string
	NATSReplicas     int
	NATSEmbedListen  string

	GiteaURL                string
	GiteaRunnerUUIDFile     string
	GiteaRunnerTokenFile    string
	GiteaRunnerRegTokenFile string
	GiteaRunnerName         string
	GiteaRunnerBin          string
	GiteaRunnerSHA256       string
	GiteaRunnerVersion      string
	FacadeListen            string
	// FacadeURL is RUNNER_FACADE_URL, normalized: the facades environments reach,
	// comma-separated (executor.ParseFacadeURLs); FacadeURLs the same as a list.
	FacadeURL                string
	FacadeURLs               []string
	FacadeID                 spiffeid.ID
	TrustDomain              spiffeid.TrustDomain
	CapabilityKeyFile        string
	TaskKeyFile              string
	GenerateKeys             bool
	SpiffeEndpointSocket     string
	DevCA                    bool
	PodBackend               string
	Docker                   DockerPod
	Local                    LocalPod
	Kube                     KubePod
	PodConcurrency           int
	VMConcurrency            int
	Lease, Pickup, Keepalive time.Duration
	// SchedulerLease is the TTL of the reconcile lease the scheduler replicas share
	// (SCHEDULER_LEASE_SECS): its holder renews it every third, another takes over within it
	// after the holder died.
	SchedulerLease time.Duration
	Tiers          []string
	// GrantsFile is GRANTS_FILE, and Grants its policy, loaded at boot: which tiers each
	// repository owner and repository may use (nil without the file: every tier).
	GrantsFile string
	Grants     *grants.Policy
	// DrainTimeout is DRAIN_SECS: how long a stopping process's workers drain (take nothing
	// new, finish what they hold) before it stops; zero stops at once.
	DrainTimeout time.Duration
	// Admission is the scheduler's admission queue (MAX_QUEUED, QUEUE_SECS, FAIRNESS,
	// FAIR_SHARE_CAP); its zero value, the default, is no queue.
	Admission scheduler.Admission
	// AdmitCapacity is ADMIT_CAPACITY: where admission takes each tier's capacity from
	// (CapacityStatic or CapacityWorkers).
	AdmitCapacity string
	// Autoscale is the built-in actuator (AUTOSCALE=docker); off by default.
	Autoscale Autoscale
	// GitHub is the second forge (GITHUB_CONFIG_URL and the GITHUB_* variables); off by
	// default.
	GitHub        GitHub
	VM            VM
	FetchInterval time.Duration
	// LivenessTTL is how long a component's heartbeat in the components bucket outlives its
	// last beat (LIVENESS_TTL): every process beats every third of it, and `dynrunner status`
	// stops listing one that was killed within it. Every component must use the same.
	LivenessTTL time.Duration
}

// The default capacity of one pod worker (POD_CONCURRENCY) and one vm worker (VM_CONCURRENCY).
const (
	DefaultPodConcurrency = 4
	DefaultVMConcurrency  = 1
)

// HasTier reports whether the scheduler routes jobs to tier.
func (c Controller) HasTier(tier string) bool { return slices.Contains(c.Tiers, tier) }

// Has reports whether the component is enabled.
func (c Controller) Has(component string) bool { return slices.Contains(c.Components, component) }

// Embedded reports whether the controller embeds its NATS server.
func (c Controller) Embedded() bool { return c.NATSURL == "" }

type env struct {
	get  func(string) string
	errs []error
}

func (e *env) str(name, def string) string {
	if v, ok := e.lookup(name); ok {
		return v
	}
	return def
}

func (e *env) lookup(name string) (string, bool) {
	v := strings.TrimSpace(e.get(name))
	return v, v != ""
}

func (e *env) fail(format string, args ...any) { e.errs = append(e.errs, fmt.Errorf(format, args...)) }

func (e *env) integer(name string, def, min int) int {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		e.fail("%s=%q: want an integer of at least %d", name, v, min)
		return def
	}
	return n
}

func (e *env) seconds(name string, def, floor int) time.Duration {
	return time.Duration(e.integer(name, def, floor)) * time.Second
}

// Defaults the operator commands (`dynrunner events`, `dynrunner status`) share with the
// controller, to find a controller running on its defaults.
const (
	DefaultHTTPListen         = "127.0.0.1:9464"
	DefaultNATSEmbeddedListen = "127.0.0.1:4222"
)

// Bounds and default of LIVENESS_TTL.
const (
	DefaultLivenessTTL = 30 * time.Second
	MinLivenessTTL     = 3 * time.Second
	MaxLivenessTTL     = 10 * time.Minute
)

// DefaultStateDir is STATE_DIR when unset: $HOME/.local/state/dynrunner.
func DefaultStateDir() string {
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "dynrunner")
}

// LoadController reads the controller's configuration. getenv is os.Getenv outside tests.
// All problems are reported together.
func LoadController(getenv func(string) string) (Controller, error) {
	e := &env{get: getenv}
	var c Controller

	vmImage := e.str("VM_IMAGE", "")
	c.Components = parseComponents(e, e.str("COMPONENTS", "all"), vmImage != "" || e.str("VM_BACKEND", "") == "opensandbox")
	c.StateDir = e.str("STATE_DIR", DefaultStateDir())
	if !filepath.IsAbs(c.StateDir) {
		if abs, err := filepath.Abs(c.StateDir); err == nil {
			c.StateDir = abs
		}
	}
	c.LogFormat = e.str("LOG_FORMAT", "json")
	c.LogLevel = e.str("LOG_LEVEL", "info")
	c.HTTPListen = e.str("HTTP_LISTEN", DefaultHTTPListen)
	if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
		e.fail("HTTP_LISTEN=%q: want host:port", c.HTTPListen)
	}

	c.NATSURL = e.str("NATS_URL", "")
	c.NATSUser = e.str("NATS_USER", "")
	c.NATSPasswordFile = e.str("NATS_PASSWORD_FILE", "")
	c.NATSReplicas = e.integer("NATS_REPLICAS", 1, 1)
	c.NATSEmbedListen = e.str("NATS_EMBEDDED_LISTEN", DefaultNATSEmbeddedListen)
	if c.NATSEmbedListen == "off" {
		c.NATSEmbedListen = ""
	} else if host, _, err := net.SplitHostPort(c.NATSEmbedListen); err != nil {
		e.fail("NATS_EMBEDDED_LISTEN=%q: want a loopback host:port or off", c.NATSEmbedListen)
	} else if !isLoopback(host) {
		e.fail("NATS_EMBEDDED_LISTEN=%q: the embedded server serves loopback only; for more, run a NATS cluster and set NATS_URL", c.NATSEmbedListen)
	}
	switch {
	case c.NATSURL == "" && (c.NATSUser != "" || c.NATSPasswordFile != ""):
		e.fail("NATS_USER/NATS_PASSWORD_FILE are set but NATS_URL is not: the embedded server takes no credentials; set NATS_URL or unset them")
	case c.NATSUser != "" && c.NATSPasswordFile == "":
		e.fail("NATS_USER is set without NATS_PASSWORD_FILE: set both or neither")
	case c.NATSUser == "" && c.NATSPasswordFile != "":
		e.fail("NATS_PASSWORD_FILE is set without NATS_USER: set both or neither")
	}
	if c.NATSURL == "" && c.NATSReplicas != 1 {
		e.fail("NATS_REPLICAS=%d needs a NATS cluster in NATS_URL; the embedded server holds one replica", c.NATSReplicas)
	}

	c.GiteaURL = strings.TrimRight(e.str("GITEA_URL", ""), "/")
	c.GiteaRunnerUUIDFile = e.str("GITEA_RUNNER_UUID_FILE", "")
	c.GiteaRunnerTokenFile = e.str("GITEA_RUNNER_TOKEN_FILE", "")
	c.GiteaRunnerRegTokenFile = e.str("GITEA_RUNNER_REGISTRATION_TOKEN_FILE", "")
	host, _ := os.Hostname()
	c.GiteaRunnerName = e.str("GITEA_RUNNER_NAME", "dynrunner-"+host)
	c.PodBackend = e.str("POD_BACKEND", "local")
	c.GiteaRunnerBin = e.str("GITEA_RUNNER_BIN", "")
	c.GiteaRunnerSHA256 = strings.ToLower(e.str("GITEA_RUNNER_SHA256", ""))
	c.GiteaRunnerVersion = e.str("GITEA_RUNNER_VERSION", "v1.0.8")
	if c.Has(Scheduler) || c.Has(Facade) {
		if c.GiteaURL == "" {
			e.fail("GITEA_URL is required with the scheduler and the facade")
		} else if u, err := url.Parse(c.GiteaURL); err != nil {
			// Not even a URL: quote none of it, it may hold a password.
			e.fail("GITEA_URL is not a URL; want http(s)://host[:port][/path]")
		} else if u.User != nil {
			e.fail("GITEA_URL=%q: must not hold credentials (the resident runner's come from GITEA_RUNNER_*_FILE)", u.Redacted())
		} else if _, err := assignment.ParseForgeURL(c.GiteaURL); err != nil {
			e.fail("GITEA_URL=%q: want http(s)://host[:port][/path], without query or fragment", c.GiteaURL)
		}
	}
	if (c.GiteaRunnerUUIDFile == "") != (c.GiteaRunnerTokenFile == "") {
		e.fail("GITEA_RUNNER_UUID_FILE and GITEA_RUNNER_TOKEN_FILE must be set together")
	}
	if c.GiteaRunnerUUIDFile != "" && c.GiteaRunnerRegTokenFile != "" {
		e.fail("set either GITEA_RUNNER_UUID_FILE/GITEA_RUNNER_TOKEN_FILE or GITEA_RUNNER_REGISTRATION_TOKEN_FILE, not both")
	}
	if c.Has(Facade) != c.Has(Scheduler) && c.GiteaRunnerRegTokenFile != "" {
		e.fail("the facade forwards reports with the scheduler's runner credentials: when they run in separate processes, give both GITEA_RUNNER_UUID_FILE and GITEA_RUNNER_TOKEN_FILE instead of GITEA_RUNNER_REGISTRATION_TOKEN_FILE")
	}
	// Docker environments run the runner inside the executor image; GITEA_RUNNER_BIN is the
	// host's copy, for local environments and microVMs.
	hostRunner := (c.Has(PodWorker) && c.PodBackend == "local") || c.Has(VMWorker)
	if c.Has(PodWorker) || c.Has(VMWorker) {
		switch {
		case hostRunner && c.GiteaRunnerBin == "":
			e.fail("GITEA_RUNNER_BIN is required with the pod and vm workers: the pinned Gitea runner environments run (scripts/tools.sh builds it)")
		case len(c.GiteaRunnerSHA256) != 64 || strings.Trim(c.GiteaRunnerSHA256, "0123456789abcdef") != "":
			if c.GiteaRunnerBin == "" {
				e.fail("GITEA_RUNNER_SHA256 must be the 64-hex-digit SHA-256 of the Gitea runner in the executor image (its label dynrunner.gitea-runner.sha256)")
			} else {
				e.fail("GITEA_RUNNER_SHA256 must be the 64-hex-digit SHA-256 of GITEA_RUNNER_BIN (sha256sum %s)", c.GiteaRunnerBin)
			}
		}
	}

	tdName := e.str("SPIFFE_TRUST_DOMAIN", "dynrunner.local")
	td, err := spiffeid.TrustDomainFromString(tdName)
	if err != nil {
		e.fail("SPIFFE_TRUST_DOMAIN=%q: %v", tdName, err)
	}
	c.TrustDomain = td
	c.FacadeListen = e.str("RUNNER_FACADE_LISTEN", "127.0.0.1:8443")
	if _, _, err := net.SplitHostPort(c.FacadeListen); err != nil {
		e.fail("RUNNER_FACADE_LISTEN=%q: want host:port", c.FacadeListen)
	}
	c.FacadeURL = strings.TrimRight(e.str("RUNNER_FACADE_URL", "https://"+c.FacadeListen), "/")
	if urls, err := executor.ParseFacadeURLs(c.FacadeURL); err != nil {
		e.fail("RUNNER_FACADE_URL=%q: %v (the facade speaks mTLS only; environments fail over between the facades of a comma-separated list)", c.FacadeURL, err)
	} else {
		c.FacadeURLs, c.FacadeURL = urls, strings.Join(urls, ",")
	}
	if id, set := e.spiffeIDIn("RUNNER_FACADE_SPIFFE_ID", td); set {
		c.FacadeID = id
	} else if !td.IsZero() {
		c.FacadeID = spiffeid.RequireFromPath(td, "/dynrunner/facade")
	}

	switch c.PodBackend {
	case "local", "docker", "kubernetes":
	default:
		e.fail("POD_BACKEND=%q: want local, docker or kubernetes", c.PodBackend)
	}
	c.Docker = loadDocker(e, c)
	c.SpiffeEndpointSocket = e.str("SPIFFE_ENDPOINT_SOCKET", "")
	c.DevCA = c.SpiffeEndpointSocket == ""
	c.Kube = loadKube(e, c)
	if !c.DevCA && c.PodBackend == "docker" && c.Has(PodWorker) {
		// The docker backend mounts the socket's directory into every container.
		if p, ok := strings.CutPrefix(c.SpiffeEndpointSocket, "unix://"); !ok || !strings.HasPrefix(p, "/") || filepath.Dir(filepath.Clean(p)) == "/" {
			e.fail("SPIFFE_ENDPOINT_SOCKET=%q with POD_BACKEND=docker: want unix:///<dir>/<socket>, the SPIRE agent's socket on this host in a directory of its own (the backend mounts that directory into each container)", c.SpiffeEndpointSocket)
		}
	}

	c.CapabilityKeyFile = e.str("RUNNER_FACADE_CAPABILITY_KEY_FILE", "")
	c.TaskKeyFile = e.str("TASK_ENCRYPTION_KEY_FILE", "")
	c.GenerateKeys = c.Embedded()
	if !c.Embedded() {
		if c.CapabilityKeyFile == "" {
			e.fail("RUNNER_FACADE_CAPABILITY_KEY_FILE is required with NATS_URL: every controller replica must share the key")
		}
		if c.TaskKeyFile == "" {
			e.fail("TASK_ENCRYPTION_KEY_FILE is required with NATS_URL: every controller replica must share the key")
		}
	}
	if c.CapabilityKeyFile == "" {
		c.CapabilityKeyFile = filepath.Join(c.StateDir, "capability.key")
	}
	if c.TaskKeyFile == "" {
		c.TaskKeyFile = filepath.Join(c.StateDir, "task.key")
	}

	c.PodConcurrency = e.integer("POD_CONCURRENCY", DefaultPodConcurrency, 1)
	c.Local = loadLocal(e, c)
	c.VMConcurrency = e.integer("VM_CONCURRENCY", DefaultVMConcurrency, 1)
	c.Lease = e.seconds("LEASE_SECS", 300, 90)
	c.Pickup = e.seconds("PICKUP_SECS", 120, 60)
	if c.Pickup >= c.Lease {
		e.fail("PICKUP_SECS=%d must be below LEASE_SECS=%d", int(c.Pickup.Seconds()), int(c.Lease.Seconds()))
	}
	c.Keepalive = e.seconds("KEEPALIVE_SECS", 60, 5)
	if c.Keepalive >= 10*time.Minute {
		e.fail("KEEPALIVE_SECS must be below 600: Gitea fails tasks silent for 10 minutes")
	}
	c.SchedulerLease = e.seconds("SCHEDULER_LEASE_SECS", 15, 3)
	if c.SchedulerLease+c.Keepalive >= 10*time.Minute {
		e.fail("SCHEDULER_LEASE_SECS=%d with KEEPALIVE_SECS=%d: their sum must be below 600: a task gets no keepalive while the lease passes to another scheduler, and Gitea fails tasks silent for 10 minutes",
			int(c.SchedulerLease.Seconds()), int(c.Keepalive.Seconds()))
	}
	c.GrantsFile = e.str("GRANTS_FILE", "")
	if c.GrantsFile != "" && (c.Has(Scheduler) || c.Has(PodWorker) || c.Has(VMWorker)) {
		if p, err := grants.Load(c.GrantsFile); err != nil {
			e.fail("GRANTS_FILE: %v", err)
		} else {
			c.Grants = p
		}
	}
	c.Admission = loadAdmission(e)
	c.AdmitCapacity, c.Autoscale = loadAutoscale(e, c)
	c.GitHub = loadGitHub(e, c)
	c.DrainTimeout = e.seconds("DRAIN_SECS", 0, 0)
	c.VM = loadVM(e, c, vmImage)
	c.Tiers = []string{"pod"}
	if c.Has(VMWorker) {
		c.Tiers = append(c.Tiers, "vm")
	}
	if v, ok := e.lookup("TIERS"); ok {
		c.Tiers = nil
		for _, t := range strings.Split(v, ",") {
			switch t = strings.TrimSpace(t); t {
			case "pod", "vm":
				c.Tiers = append(c.Tiers, t)
			default:
				e.fail("TIERS: unknown tier %q; want pod, vm or both", t)
			}
		}
	}
	fi := e.str("FETCH_INTERVAL", "1s")
	c.FetchInterval, err = time.ParseDuration(fi)
	if err != nil || c.FetchInterval < 100*time.Millisecond {
		e.fail("FETCH_INTERVAL=%q: want a Go duration of at least 100ms", fi)
	}
	lt := e.str("LIVENESS_TTL", DefaultLivenessTTL.String())
	c.LivenessTTL, err = time.ParseDuration(lt)
	if err != nil || c.LivenessTTL < MinLivenessTTL || c.LivenessTTL > MaxLivenessTTL {
		e.fail("LIVENESS_TTL=%q: want a Go duration from %s to %s (every process beats every third of it)", lt, MinLivenessTTL, MaxLivenessTTL)
		c.LivenessTTL = DefaultLivenessTTL
	}
	if c.Autoscale.Backend != "" && c.Autoscale.Cooldown <= c.LivenessTTL/liveness.BeatsPerTTL {
		e.fail("AUTOSCALE_COOLDOWN=%s is not above a heartbeat's interval (LIVENESS_TTL/%d = %s): the actuator would act again before the workers report its last step", c.Autoscale.Cooldown, liveness.BeatsPerTTL, c.LivenessTTL/liveness.BeatsPerTTL)
	}
	return c, errors.Join(e.errs...)
}

func parseComponents(e *env, v string, vm bool) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		switch p = strings.TrimSpace(p); p {
		case "all":
			out = append(out, Scheduler, Facade, PodWorker)
			if vm {
				out = append(out, VMWorker)
			}
		case Scheduler, Facade, PodWorker, VMWorker:
			out = append(out, p)
		case "":
		default:
			e.fail("COMPONENTS: unknown component %q; want all or a list of scheduler, facade, pod-worker, vm-worker", p)
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		e.fail("COMPONENTS is empty")
	}
	return out
}

// isLoopback reports whether host (a name or an IP address) is this machine's loopback.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// LoopbackURL reports whether the URL u names a loopback host.
func LoopbackURL(u string) bool {
	parsed, err := url.Parse(u)
	return err == nil && isLoopback(parsed.Hostname())
}

// LoopbackURLs returns the URLs of list (comma-separated, as RUNNER_FACADE_URL) that name a
// loopback host.
func LoopbackURLs(list string) []string {
	var out []string
	for u := range strings.SplitSeq(list, ",") {
		if u = strings.TrimSpace(u); LoopbackURL(u) {
			out = append(out, u)
		}
	}
	return out
}

// loadAdmission reads the admission queue's settings. Fairness and a share cap decide the
// order of the queue, so they need one: set without MAX_QUEUED they refuse the boot rather than
// be silently ignored.
func loadAdmission(e *env) scheduler.Admission {
	a := scheduler.Admission{
		MaxQueued: e.integer("MAX_QUEUED", 0, 0),
		Queue:     e.seconds("QUEUE_SECS", 1800, 60),
		ShareCap:  e.integer("FAIR_SHARE_CAP", 0, 0),
	}
	f, err := scheduler.ParseFairness(e.str("FAIRNESS", ""))
	if err != nil {
		e.fail("%v", err)
	}
	a.Fairness = f
	if !a.Enabled() {
		if a.Fairness != scheduler.FairnessFIFO {
			e.fail("FAIRNESS=%s needs an admission queue to order: set MAX_QUEUED to how many claims of a tier may wait for capacity", a.Fairness)
		}
		if a.ShareCap > 0 {
			e.fail("FAIR_SHARE_CAP=%d needs an admission queue to hold an owner's claims past it: set MAX_QUEUED", a.ShareCap)
		}
	}
	return a
}
