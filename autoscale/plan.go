package autoscale

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Member is one pod-worker container the actuator started, with what its worker's heartbeat
// and cordon say.
type Member struct {
	// Name is the container's name; Host its host name, which its worker's heartbeat carries.
	Name, Host string
	// Running: the container runs (or the engine restarts it). One that exited is gone: its
	// environments are adopted elsewhere and it only needs removing.
	Running bool
	Created time.Time
	// Worker is its worker's heartbeat key (pod-worker.<instance>), empty before the first
	// heartbeat; InFlight, Draining and Beat (when it was written) are from that heartbeat.
	Worker   string
	InFlight int
	Draining bool
	Beat     time.Time
	// Cordoned: a cordon names Worker, written at CordonedAt; Ours: by the actuator (one an
	// operator wrote with `dynrunner drain` it neither lifts nor acts on).
	Cordoned   bool
	CordonedAt time.Time
	Ours       bool
}

// active: the member takes new environments, or will once it has booted.
func (m Member) active() bool { return m.Running && !m.Cordoned && !m.Draining }

// drained: cordoned by the actuator, and its worker says, in a heartbeat written after the
// cordon, that it drains with nothing in flight (read after it drains, so it can only be too
// high): safe to remove.
func (m Member) drained() bool {
	return m.Running && m.Cordoned && m.Ours && m.Worker != "" && m.Draining && m.InFlight == 0 && m.Beat.After(m.CordonedAt)
}

// stuck: running, yet no heartbeat names it long after it was created (a worker that cannot
// boot or reach NATS): it holds no environment this actuator can see, and a slot of Max.
func (m Member) stuck(now time.Time, boot time.Duration) bool {
	return m.Running && m.Worker == "" && boot > 0 && now.Sub(m.Created) > boot
}

// Policy bounds the actuator: AUTOSCALE_MIN, AUTOSCALE_MAX (containers, draining ones
// included) and AUTOSCALE_COOLDOWN (at most one start per cooldown; a surplus must last a
// cooldown before a step down). Boot is how long a container may run without a heartbeat
// before it is taken for stuck and removed (zero: never).
type Policy struct {
	Min, Max int
	Cooldown time.Duration
	Boot     time.Duration
}

// DefaultBoot is the Boot the actuator runs with: far above a pod worker's start (seconds).
const DefaultBoot = 10 * time.Minute

// Memory is what the actuator remembers between rounds.
type Memory struct {
	// LastUp is when it last scaled up, LastDown when it last cordoned a surplus; Surplus
	// when the current surplus began (zero: none).
	LastUp, LastDown, Surplus time.Time
}

// Steps are what one round does.
type Steps struct {
	// Start is how many new pod-worker containers to start.
	Start int
	// Uncordon and Cordon are worker heartbeat keys whose cordon to lift or write.
	Uncordon, Cordon []string
	// Remove are containers to remove: drained or exited.
	Remove []Member
	// Target is the number of active workers wanted (the decision within Min and Max), and
	// Reason what was decided, for the log.
	Target int
	Reason string
}

// Empty reports whether the steps change nothing.
func (s Steps) Empty() bool {
	return s.Start == 0 && len(s.Uncordon) == 0 && len(s.Cordon) == 0 && len(s.Remove) == 0
}

// Plan decides one round: desired is the tier's desired_workers (fleet.Decide), members the
// containers the actuator started. It removes exited and stuck containers and drained ones;
// below the target it lifts its own cordons first (a draining worker is already running) and
// then starts new containers, within Max and at most once per cooldown; above it, once the
// surplus has lasted a cooldown, it cordons the surplus, the workers with the least in flight
// first. It never removes a running worker that is not drained or stuck. mem is updated.
func Plan(desired int, members []Member, p Policy, mem *Memory, now time.Time) Steps {
	s := Steps{Target: min(max(desired, p.Min), p.Max)}
	var active, cordoned []Member
	running := 0
	for _, m := range members {
		switch {
		case !m.Running, m.stuck(now, p.Boot):
			s.Remove = append(s.Remove, m)
			continue
		case m.active():
			active = append(active, m)
		case m.Cordoned && m.Ours && m.Worker != "":
			cordoned = append(cordoned, m)
		}
		running++
	}
	have := len(active)
	switch {
	case have < s.Target:
		mem.Surplus = time.Time{}
		need := s.Target - have
		// Lift the cordons of the busiest draining workers first: they run already, and
		// lifting costs nothing, so no cooldown holds it back.
		slices.SortFunc(cordoned, func(a, b Member) int { return cmp.Compare(b.InFlight, a.InFlight) })
		for _, m := range cordoned[:min(need, len(cordoned))] {
			s.Uncordon = append(s.Uncordon, m.Worker)
			need--
		}
		if wait := mem.LastUp.Add(p.Cooldown).Sub(now); need > 0 && !mem.LastUp.IsZero() && wait > 0 {
			s.Reason = fmt.Sprintf("%d of %d workers active: lift %d cordons; start %d more after the cooldown, in %s", have, s.Target, len(s.Uncordon), need, wait.Round(time.Second))
			break
		}
		s.Start = max(min(need, p.Max-running), 0)
		s.Reason = fmt.Sprintf("%d of %d workers active: lift %d cordons, start %d", have, s.Target, len(s.Uncordon), s.Start)
		if s.Start < need {
			s.Reason += fmt.Sprintf(" (AUTOSCALE_MAX=%d containers)", p.Max)
		}
		if s.Start > 0 {
			mem.LastUp = now
		}
	case have > s.Target:
		if mem.Surplus.IsZero() {
			mem.Surplus = now
		}
		since := latest(mem.Surplus, mem.LastUp, mem.LastDown)
		if wait := since.Add(p.Cooldown).Sub(now); wait > 0 {
			s.Reason = fmt.Sprintf("%d of %d workers active: %d surplus, drain in %s unless demand returns", have, s.Target, have-s.Target, wait.Round(time.Second))
			break
		}
		// Only a worker whose heartbeat names it can be cordoned; the idle and the newest first.
		known := slices.DeleteFunc(slices.Clone(active), func(m Member) bool { return m.Worker == "" })
		slices.SortFunc(known, func(a, b Member) int {
			return cmp.Or(cmp.Compare(a.InFlight, b.InFlight), b.Created.Compare(a.Created), strings.Compare(a.Name, b.Name))
		})
		for _, m := range known[:min(have-s.Target, len(known))] {
			s.Cordon = append(s.Cordon, m.Worker)
		}
		s.Reason = fmt.Sprintf("%d of %d workers active: drain %d", have, s.Target, len(s.Cordon))
		if len(s.Cordon) > 0 {
			mem.LastDown, mem.Surplus = now, time.Time{}
		}
	default:
		mem.Surplus = time.Time{}
		s.Reason = fmt.Sprintf("%d of %d workers active", have, s.Target)
	}
	// A drained worker goes unless its cordon is lifted (busier ones are lifted first).
	for _, m := range cordoned {
		if m.drained() && !slices.Contains(s.Uncordon, m.Worker) {
			s.Remove = append(s.Remove, m)
		}
	}
	return s
}

// latest is the latest of ts.
func latest(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}
