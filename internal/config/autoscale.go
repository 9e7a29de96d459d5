package config

import (
	"strings"
	"time"
)

// Admission capacity sources (ADMIT_CAPACITY).
const (
	// CapacityStatic: POD_CONCURRENCY and VM_CONCURRENCY of the scheduler are the capacity of
	// the whole fleet per tier (the default).
	CapacityStatic = "static"
	// CapacityWorkers: the capacity per tier is what the workers online announce in their
	// heartbeats (the slots of those taking work, plus what draining ones still hold), so
	// admission follows a fleet that an autoscaler grows and shrinks.
	CapacityWorkers = "workers"
)

// Autoscale configures the built-in actuator (AUTOSCALE=docker): the scheduler holding the
// reconcile lease starts and removes pod-worker containers on one Docker engine, within Min
// and Max, at most one step up per Cooldown, scaling in only through drain.
type Autoscale struct {
	// Backend is AUTOSCALE: "" (off, the default) or "docker".
	Backend  string
	Min, Max int
	Cooldown time.Duration
	// Template is AUTOSCALE_DOCKER_TEMPLATE: the name of a container (created, need not run)
	// whose configuration every new pod worker copies: image, environment, mounts, networks.
	Template string
	// Socket is AUTOSCALE_DOCKER_SOCKET: the Docker engine's unix socket.
	Socket string
}

// Autoscale actuator bounds.
const (
	DefaultAutoscaleMax      = 4
	DefaultAutoscaleCooldown = time.Minute
	MinAutoscaleCooldown     = time.Second
	MaxAutoscaleCooldown     = time.Hour
)

// loadAutoscale reads ADMIT_CAPACITY and the AUTOSCALE_* variables. The actuator needs demand
// beyond the capacity online to be visible (the admission queue) and admission to follow the
// workers it starts (ADMIT_CAPACITY=workers); without either it would never scale up, so it
// refuses the boot instead.
func loadAutoscale(e *env, c Controller) (string, Autoscale) {
	capacity := e.str("ADMIT_CAPACITY", CapacityStatic)
	switch capacity {
	case CapacityStatic:
	case CapacityWorkers:
		if !c.Admission.Enabled() {
			e.fail("ADMIT_CAPACITY=workers needs an admission queue: with no worker online every claim waits in it; set MAX_QUEUED to how many claims of a tier may wait")
		}
	default:
		e.fail("ADMIT_CAPACITY=%q: want static (POD_CONCURRENCY and VM_CONCURRENCY are the fleet's capacity) or workers (the capacity the workers online announce)", capacity)
	}
	a := Autoscale{
		Backend:  e.str("AUTOSCALE", ""),
		Min:      e.integer("AUTOSCALE_MIN", 0, 0),
		Max:      e.integer("AUTOSCALE_MAX", DefaultAutoscaleMax, 1),
		Template: e.str("AUTOSCALE_DOCKER_TEMPLATE", ""),
		Socket:   strings.TrimPrefix(e.str("AUTOSCALE_DOCKER_SOCKET", "/var/run/docker.sock"), "unix://"),
	}
	cd := e.str("AUTOSCALE_COOLDOWN", DefaultAutoscaleCooldown.String())
	var err error
	a.Cooldown, err = time.ParseDuration(cd)
	if err != nil || a.Cooldown < MinAutoscaleCooldown || a.Cooldown > MaxAutoscaleCooldown {
		e.fail("AUTOSCALE_COOLDOWN=%q: want a Go duration from %s to %s", cd, MinAutoscaleCooldown, MaxAutoscaleCooldown)
	}
	switch a.Backend {
	case "":
		return capacity, a
	case "docker":
	default:
		e.fail("AUTOSCALE=%q: want docker (the built-in actuator on one Docker engine) or nothing (off; scale the pod workers with KEDA or another autoscaler from GET /v1/fleet/autoscale)", a.Backend)
		return capacity, a
	}
	if !c.Has(Scheduler) {
		e.fail("AUTOSCALE=docker runs in the scheduler: add scheduler to COMPONENTS, or set AUTOSCALE on the scheduler's process")
	}
	if c.Has(PodWorker) {
		e.fail("AUTOSCALE=docker with pod-worker in COMPONENTS: the actuator counts only the pod workers it starts, so this process's own would be one too many and the tier could never scale to zero; run COMPONENTS=scheduler,facade (or scheduler) beside it")
	}
	if capacity != CapacityWorkers {
		e.fail("AUTOSCALE=docker needs ADMIT_CAPACITY=workers: admission must follow the workers the actuator starts, or no job runs on them")
	}
	if a.Min > a.Max {
		e.fail("AUTOSCALE_MIN=%d is above AUTOSCALE_MAX=%d", a.Min, a.Max)
	}
	if !dockerNameRe.MatchString(a.Template) {
		e.fail("AUTOSCALE_DOCKER_TEMPLATE=%q: want the name of a container (created with `docker create`, COMPONENTS=pod-worker) whose configuration new pod workers copy", a.Template)
	}
	if len(a.Socket) == 0 || a.Socket[0] != '/' {
		e.fail("AUTOSCALE_DOCKER_SOCKET=%q: want the absolute path of the Docker engine's unix socket", a.Socket)
	}
	return capacity, a
}
