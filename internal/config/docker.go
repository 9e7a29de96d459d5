package config

import (
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// DockerPod configures the docker pod backend (POD_BACKEND=docker).
type DockerPod struct {
	Socket  string
	Image   string
	Network string
	// Subnet is the IPv4 subnet of the job network dynrunner creates when Network does not
	// exist; zero lets the engine pick one.
	Subnet     netip.Prefix
	MemoryMiB  int
	CPUs       float64
	Pids       int
	Privileged bool
	User       string
	Scope      string
}

var (
	imageByDigestRe = regexp.MustCompile(`^(sha256:[0-9a-f]{64}|[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64})$`)
	dockerNameRe    = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)
	dockerUserRe    = regexp.MustCompile(`^[0-9]{1,10}:[0-9]{1,10}$`)
	dockerScopeRe   = regexp.MustCompile(`^[a-z0-9]{1,32}$`)
)

// DefaultDockerNetwork is POD_DOCKER_NETWORK's default: the isolated bridge network the
// controller creates for job containers.
const DefaultDockerNetwork = "dynrunner"

// loadDocker reads POD_EXECUTOR_IMAGE and the POD_DOCKER_* variables; it checks them only when
// the pod worker runs the docker backend.
func loadDocker(e *env, c Controller) DockerPod {
	d := DockerPod{
		Socket:    strings.TrimPrefix(e.str("POD_DOCKER_SOCKET", "/var/run/docker.sock"), "unix://"),
		Image:     e.str("POD_EXECUTOR_IMAGE", ""),
		Network:   e.str("POD_DOCKER_NETWORK", DefaultDockerNetwork),
		MemoryMiB: e.integer("POD_DOCKER_MEMORY_MIB", 4096, 64),
		Pids:      e.integer("POD_DOCKER_PIDS", 4096, 16),
		User:      e.str("POD_DOCKER_USER", ""),
		Scope:     e.str("POD_DOCKER_SCOPE", "default"),
	}
	if s := e.str("POD_DOCKER_SUBNET", ""); s != "" {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() || p.Bits() > 29 || p.Masked() != p {
			e.fail("POD_DOCKER_SUBNET=%q: want an IPv4 network of at least 8 addresses, such as 10.210.0.0/24", s)
		}
		d.Subnet = p
	}
	cpus := e.str("POD_DOCKER_CPUS", "2")
	n, err := strconv.ParseFloat(cpus, 64)
	if err != nil || n < 0.01 || n > 4096 {
		e.fail("POD_DOCKER_CPUS=%q: want a number of CPUs, at least 0.01", cpus)
	}
	d.CPUs = n
	switch p := e.str("POD_DOCKER_PRIVILEGED", "false"); p {
	case "true":
		d.Privileged = true
	case "false":
	default:
		e.fail("POD_DOCKER_PRIVILEGED=%q: want true or false", p)
	}
	if !c.Has(PodWorker) || c.PodBackend != "docker" {
		return d
	}
	if !imageByDigestRe.MatchString(d.Image) {
		e.fail("POD_EXECUTOR_IMAGE=%q: the docker backend runs an image pinned by digest: sha256:<64 hex> (the local image ID scripts/executor-image.sh prints) or name@sha256:<64 hex>; a tag is refused", d.Image)
	}
	if len(d.Socket) == 0 || d.Socket[0] != '/' {
		e.fail("POD_DOCKER_SOCKET=%q: want the absolute path of the Docker engine's unix socket", d.Socket)
	}
	if !dockerNameRe.MatchString(d.Network) {
		e.fail("POD_DOCKER_NETWORK=%q: want a Docker network name (host, bridge or a user-defined network)", d.Network)
	}
	if d.User != "" && !dockerUserRe.MatchString(d.User) {
		e.fail("POD_DOCKER_USER=%q: want numeric uid:gid", d.User)
	}
	if !dockerScopeRe.MatchString(d.Scope) {
		e.fail("POD_DOCKER_SCOPE=%q: want 1 to 32 lowercase letters and digits", d.Scope)
	}
	// Outside the host network, a container's loopback is its own. A controller that serves the
	// facade too serves it on the gateway of a network it created (checked at boot, when the
	// network is known); a pod worker alone needs a facade URL its containers reach.
	if lo := LoopbackURLs(c.FacadeURL); d.Network != "host" && len(lo) > 0 && !c.Has(Facade) {
		e.fail("RUNNER_FACADE_URL=%q: containers on network %s cannot reach a loopback facade (%s), and this process does not serve the facade (COMPONENTS); give the address of a facade they reach", c.FacadeURL, d.Network, strings.Join(lo, ", "))
	}
	return d
}
