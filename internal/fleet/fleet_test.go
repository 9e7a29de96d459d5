package fleet_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

var t0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

func sched(host string, lease bool) liveness.Record {
	return liveness.Record{Kind: liveness.KindScheduler, Instance: host + "/1/a", Host: host, Scheduler: &liveness.SchedulerInfo{ReconcileLease: lease}}
}

func facade(host string) liveness.Record {
	return liveness.Record{Kind: liveness.KindFacade, Instance: host + "/1/a", Host: host, Facade: &liveness.FacadeInfo{URL: "https://" + host}}
}

func worker(kind, host string, capacity, inFlight int) liveness.Record {
	return liveness.Record{Kind: kind, Instance: host + "/1/a", Host: host, Worker: &liveness.WorkerInfo{Capacity: capacity, InFlight: inFlight}}
}

func state(task assignment.TaskID, tier assignment.Backend, phase assignment.Phase) assignment.State {
	return assignment.State{Record: assignment.Record{Task: task, Backend: tier, Phase: phase, Transition: phase}, Seq: uint64(task)}
}

// slot is a GitHub slot's state.
func slot(n int, tier assignment.Backend, phase assignment.Phase) assignment.State {
	s := state(assignment.SlotBase+assignment.TaskID(n), tier, phase)
	s.Forge, s.ScaleSet, s.RunnerName = assignment.ForgeGitHub, 1, fmt.Sprintf("dynrunner-pod-%d", n)
	return s
}

// noWork is the Work of a fleet with nothing live.
func noWork() fleet.Work {
	return fleet.Work{ByPhase: map[assignment.Phase]int{}, ByTier: map[assignment.Backend]int{},
		ByTierPhase: map[assignment.Backend]map[assignment.Phase]int{}, ByForge: map[string]int{}}
}

func TestBuild(t *testing.T) {
	tests := []struct {
		name       string
		components []liveness.Record
		states     []assignment.State
		missing    []string
		count      map[string]int
		capacity   map[assignment.Backend]liveness.WorkerInfo
		live       fleet.Work
	}{
		{
			name:     "nothing alive",
			missing:  []string{liveness.KindScheduler, liveness.KindFacade},
			count:    map[string]int{"scheduler": 0, "facade": 0, "pod-worker": 0, "vm-worker": 0},
			capacity: map[assignment.Backend]liveness.WorkerInfo{},
			live:     noWork(),
		},
		{
			name: "a split deployment with work",
			components: []liveness.Record{
				worker(liveness.KindPodWorker, "p2", 4, 3), worker(liveness.KindVMWorker, "v1", 1, 1), facade("f1"),
				worker(liveness.KindPodWorker, "p1", 4, 1), sched("s2", false), sched("s1", true),
			},
			states: []assignment.State{
				state(1, assignment.BackendPod, assignment.Running), state(2, assignment.BackendPod, assignment.Running),
				state(3, assignment.BackendPod, assignment.Claimed), state(4, assignment.BackendVM, assignment.Started),
				state(5, assignment.BackendPod, assignment.Completed), state(6, assignment.BackendVM, assignment.Closed),
				state(7, assignment.BackendVM, assignment.Failed),
			},
			missing:  []string{},
			count:    map[string]int{"scheduler": 2, "facade": 1, "pod-worker": 2, "vm-worker": 1},
			capacity: map[assignment.Backend]liveness.WorkerInfo{"pod": {Capacity: 8, InFlight: 4}, "vm": {Capacity: 1, InFlight: 1}},
			live: fleet.Work{
				Total:   5,
				ByPhase: map[assignment.Phase]int{assignment.Running: 2, assignment.Claimed: 1, assignment.Started: 1, assignment.Failed: 1},
				ByTier:  map[assignment.Backend]int{"pod": 3, "vm": 2},
				ByTierPhase: map[assignment.Backend]map[assignment.Phase]int{
					"pod": {assignment.Running: 2, assignment.Claimed: 1},
					"vm":  {assignment.Started: 1, assignment.Failed: 1},
				},
				ByForge: map[string]int{"gitea": 5},
			},
		},
		{
			name:       "GitHub slots beside Gitea tasks",
			components: []liveness.Record{sched("s", true), facade("f"), worker(liveness.KindPodWorker, "p", 4, 4)},
			states: []assignment.State{
				state(1, assignment.BackendPod, assignment.Running),
				slot(1, assignment.BackendPod, assignment.Claimed), slot(2, assignment.BackendPod, assignment.Started),
				slot(3, assignment.BackendPod, assignment.Running), slot(4, assignment.BackendPod, assignment.Failed),
				slot(5, assignment.BackendPod, assignment.Closed),
			},
			missing:  []string{},
			count:    map[string]int{"scheduler": 1, "facade": 1, "pod-worker": 1, "vm-worker": 0},
			capacity: map[assignment.Backend]liveness.WorkerInfo{"pod": {Capacity: 4, InFlight: 4}},
			live: fleet.Work{
				Total:       5,
				ByPhase:     map[assignment.Phase]int{assignment.Running: 2, assignment.Claimed: 1, assignment.Started: 1, assignment.Failed: 1},
				ByTier:      map[assignment.Backend]int{"pod": 5},
				ByTierPhase: map[assignment.Backend]map[assignment.Phase]int{"pod": {assignment.Running: 2, assignment.Claimed: 1, assignment.Started: 1, assignment.Failed: 1}},
				ByForge:     map[string]int{"gitea": 1, "github": 4},
				GitHubJobs:  1,
			},
		},
		{
			name:       "workers without a facade",
			components: []liveness.Record{sched("s", true), worker(liveness.KindPodWorker, "p", 4, 0)},
			missing:    []string{liveness.KindFacade},
			count:      map[string]int{"scheduler": 1, "facade": 0, "pod-worker": 1, "vm-worker": 0},
			capacity:   map[assignment.Backend]liveness.WorkerInfo{"pod": {Capacity: 4}},
			live:       noWork(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := fleet.Build(tt.components, tt.states, t0)
			assert.Equal(t, t0, got.At)
			assert.Equal(t, tt.missing, got.Missing)
			assert.Equal(t, tt.count, got.Count)
			assert.Equal(t, tt.capacity, got.Capacity)
			assert.Equal(t, tt.live, got.Live)
			require.Len(t, got.Components, len(tt.components))
			for i := 1; i < len(got.Components); i++ {
				a, b := got.Components[i-1], got.Components[i]
				assert.LessOrEqual(t, kindIndex(a.Kind), kindIndex(b.Kind), "sorted by kind")
				if a.Kind == b.Kind {
					assert.Less(t, a.Host, b.Host, "sorted by host within a kind")
				}
			}
			if len(tt.missing) == 0 {
				assert.NoError(t, got.Err())
			} else {
				require.ErrorIs(t, got.Err(), fleet.ErrIncomplete)
				for _, k := range tt.missing {
					assert.ErrorContains(t, got.Err(), "no "+k+" is alive")
				}
			}
		})
	}
}

func kindIndex(kind string) int {
	for i, k := range liveness.Kinds {
		if k == kind {
			return i
		}
	}
	return len(liveness.Kinds)
}

// TestRead reads what components wrote: their heartbeats, a record that is not one (refused and
// counted), and the live assignments by the index.
func TestRead(t *testing.T) {
	l, _, js := eventlogtest.OpenJetStream(t)
	ctx := t.Context()

	// An empty fleet reads as one.
	r, err := fleet.Read(ctx, js, func() time.Time { return t0 })
	require.NoError(t, err)
	assert.Empty(t, r.Components)
	assert.Equal(t, 0, r.Live.Total)

	for _, rec := range []liveness.Record{sched("s1", true), facade("f1"), worker(liveness.KindPodWorker, "p1", 4, 1)} {
		data, err := json.Marshal(rec)
		require.NoError(t, err)
		_, err = l.Components().Put(ctx, rec.Key(), data)
		require.NoError(t, err)
	}
	_, err = l.Components().Put(ctx, "scheduler.forged", []byte(`{"kind":"scheduler","instance":"other"}`))
	require.NoError(t, err)
	gone := facade("f2")
	_, err = l.Components().Put(ctx, gone.Key(), []byte("{}"))
	require.NoError(t, err)
	require.NoError(t, l.Components().Delete(ctx, gone.Key()))

	for task := assignment.TaskID(1); task <= 3; task++ {
		st, err := l.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: task, Actor: "test", At: t0,
			Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
		require.NoError(t, err)
		if task == 3 {
			_, err = l.Apply(ctx, assignment.Event{Transition: assignment.Failed, Task: task, Epoch: st.Epoch(), Actor: "test", At: t0, Reason: "x"}, &st)
			require.NoError(t, err)
		}
	}

	r, err = fleet.Read(ctx, js, func() time.Time { return t0 })
	require.NoError(t, err)
	require.Len(t, r.Components, 3)
	assert.Equal(t, []string{"scheduler", "facade", "pod-worker"}, []string{r.Components[0].Kind, r.Components[1].Kind, r.Components[2].Kind})
	assert.Equal(t, 1, r.Rejected, "the forged record")
	assert.Empty(t, r.Missing)
	assert.Equal(t, 3, r.Live.Total)
	assert.Equal(t, map[assignment.Phase]int{assignment.Claimed: 2, assignment.Failed: 1}, r.Live.ByPhase)
	assert.Equal(t, map[assignment.Backend]int{assignment.BackendPod: 3}, r.Live.ByTier)
}
