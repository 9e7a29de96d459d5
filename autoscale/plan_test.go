package autoscale

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

func worker(name string, inFlight int) Member {
	return Member{Name: name, Host: name, Running: true, Created: t0, Worker: "pod-worker." + name, InFlight: inFlight}
}

// cordoned is m cordoned by the actuator before its last heartbeat.
func cordoned(m Member, draining bool) Member {
	m.Cordoned, m.Ours, m.Draining = true, true, draining
	m.CordonedAt, m.Beat = t0.Add(-time.Minute), t0.Add(-time.Second)
	return m
}

func operators(m Member) Member {
	m.Ours = false
	return m
}

func stale(m Member) Member {
	m.Beat = m.CordonedAt.Add(-time.Second)
	return m
}

func names(ms []Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func TestPlan(t *testing.T) {
	p := Policy{Min: 0, Max: 3, Cooldown: time.Minute}
	for _, tc := range []struct {
		name     string
		desired  int
		members  []Member
		policy   *Policy
		mem      Memory
		start    int
		cordon   []string
		uncordon []string
		remove   []string
	}{
		{name: "scale up from zero", desired: 2, start: 2},
		{name: "within max", desired: 9, members: []Member{worker("a", 4)}, start: 2},
		{name: "min keeps one at idle", desired: 0, policy: &Policy{Min: 1, Max: 3, Cooldown: time.Minute}, start: 1},
		{name: "a booting worker counts", desired: 2, members: []Member{{Name: "a", Running: true}, worker("b", 1)}},
		{name: "cooling down after a step up", desired: 3, members: []Member{worker("a", 4)}, mem: Memory{LastUp: t0.Add(-30 * time.Second)}},
		{name: "after the cooldown", desired: 3, members: []Member{worker("a", 4)}, mem: Memory{LastUp: t0.Add(-time.Minute)}, start: 2},
		{name: "lift a cordon before starting", desired: 2, members: []Member{worker("a", 4), cordoned(worker("b", 2), true)}, uncordon: []string{"pod-worker.b"}},
		{name: "max counts draining containers", desired: 3, members: []Member{worker("a", 4), worker("b", 4), {Name: "c", Running: true, Draining: true, InFlight: 1}}},
		{name: "a new surplus waits a cooldown", desired: 0, members: []Member{worker("a", 0)}},
		{name: "a lasting surplus drains the idle first", desired: 1, members: []Member{worker("a", 3), worker("b", 0), worker("c", 1)},
			mem: Memory{Surplus: t0.Add(-2 * time.Minute)}, cordon: []string{"pod-worker.b", "pod-worker.c"}},
		{name: "no drain right after a step up", desired: 0, members: []Member{worker("a", 0)},
			mem: Memory{Surplus: t0.Add(-2 * time.Minute), LastUp: t0.Add(-10 * time.Second)}},
		{name: "a worker without a heartbeat is not cordoned", desired: 0, members: []Member{{Name: "a", Running: true}},
			mem: Memory{Surplus: t0.Add(-2 * time.Minute)}},
		{name: "scale to zero", desired: 0, members: []Member{worker("a", 0)}, mem: Memory{Surplus: t0.Add(-time.Minute)}, cordon: []string{"pod-worker.a"}},
		{name: "a drained worker is removed", desired: 0, members: []Member{cordoned(worker("a", 0), true)}, remove: []string{"a"}},
		{name: "a draining worker with work is kept", desired: 0, members: []Member{cordoned(worker("a", 1), true)}},
		{name: "a cordoned worker that has not begun draining is kept", desired: 0, members: []Member{cordoned(worker("a", 0), false)}},
		{name: "an exited container is removed", desired: 1, members: []Member{{Name: "a", Host: "a", Worker: "pod-worker.a"}}, remove: []string{"a"}, start: 1},
		{name: "a drained worker is reused rather than removed", desired: 1, members: []Member{cordoned(worker("a", 0), true)}, uncordon: []string{"pod-worker.a"}},
		{name: "a cordon is lifted during the cooldown", desired: 2, members: []Member{worker("a", 2), cordoned(worker("b", 0), true)},
			mem: Memory{LastUp: t0.Add(-time.Second)}, uncordon: []string{"pod-worker.b"}},
		{name: "an operator's cordon is neither lifted nor acted on", desired: 1, members: []Member{operators(cordoned(worker("a", 0), true))}, start: 1},
		{name: "a heartbeat from before the cordon does not count", desired: 0, members: []Member{stale(cordoned(worker("a", 0), true))}},
		{name: "a container without a heartbeat after the boot time is stuck", desired: 1, policy: &Policy{Max: 3, Cooldown: time.Minute, Boot: 10 * time.Minute},
			members: []Member{{Name: "a", Running: true, Created: t0.Add(-11 * time.Minute)}}, remove: []string{"a"}, start: 1},
		{name: "a booting container is not stuck", desired: 1, policy: &Policy{Max: 3, Cooldown: time.Minute, Boot: 10 * time.Minute},
			members: []Member{{Name: "a", Running: true, Created: t0.Add(-time.Minute)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := p
			if tc.policy != nil {
				pol = *tc.policy
			}
			mem := tc.mem
			s := Plan(tc.desired, tc.members, pol, &mem, t0)
			assert.Equal(t, tc.start, s.Start, "start: %s", s.Reason)
			assert.Equal(t, tc.cordon, s.Cordon, "cordon: %s", s.Reason)
			assert.Equal(t, tc.uncordon, s.Uncordon, "uncordon: %s", s.Reason)
			assert.Equal(t, tc.remove, names(s.Remove), "remove: %s", s.Reason)
			assert.NotEmpty(t, s.Reason)
		})
	}
}

// TestPlanNeverRemovesAWorkerWithWork runs Plan over every small fleet shape: whatever the
// demand and memory, a removed container is an exited one or a drained one with nothing in
// flight.
func TestPlanNeverRemovesAWorkerWithWork(t *testing.T) {
	shapes := []Member{worker("a", 0), worker("b", 2), cordoned(worker("c", 1), true), cordoned(worker("d", 0), false),
		cordoned(worker("e", 0), true), {Name: "f", Running: true}, {Name: "g", Running: true, Draining: true, Worker: "pod-worker.g"}}
	for mask := range 1 << len(shapes) {
		var members []Member
		for i, m := range shapes {
			if mask&(1<<i) != 0 {
				members = append(members, m)
			}
		}
		for desired := range 5 {
			for _, mem := range []Memory{{}, {Surplus: t0.Add(-time.Hour)}, {LastUp: t0}} {
				s := Plan(desired, members, Policy{Max: 4, Cooldown: time.Minute}, &mem, t0)
				running := 0
				for _, m := range members {
					if m.Running {
						running++
					}
				}
				after := running + s.Start
				for _, m := range s.Remove {
					require.True(t, !m.Running || (m.Cordoned && m.Ours && m.Draining && m.InFlight == 0 && m.Beat.After(m.CordonedAt)), "removed %+v (%s)", m, s.Reason)
					if m.Running {
						after--
					}
				}
				require.LessOrEqual(t, after, max(4, running), "over AUTOSCALE_MAX: %s", s.Reason)
			}
		}
	}
}
