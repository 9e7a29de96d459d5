package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name   string
		d      Demand
		want   int
		reason string
	}{
		{"idle without workers", Demand{PerWorker: 4}, 0, "idle: scale to zero"},
		{"idle with workers", Demand{Workers: 2, Slots: 8, PerWorker: 4}, 0, "idle, 2 workers online: scale to zero"},
		{"the issue's example", Demand{Queued: 3, InFlight: 4, Workers: 2, Slots: 4, PerWorker: 2}, 4,
			"3 queued, 4 in flight, 2 workers of 4 slots online: want 2 more"},
		{"scale from zero", Demand{Queued: 1, PerWorker: 4}, 1, "1 queued, 0 in flight, 0 workers of 0 slots online: want 1 more"},
		{"enough", Demand{InFlight: 3, Workers: 1, Slots: 4, PerWorker: 4}, 1, "0 queued, 3 in flight, 1 worker of 4 slots online: enough"},
		{"fewer", Demand{InFlight: 1, Workers: 3, Slots: 12, PerWorker: 4}, 1, "0 queued, 1 in flight, 3 workers of 12 slots online: want 2 fewer"},
		{"draining workers' work is theirs to finish", Demand{Queued: 2, InFlight: 5, Workers: 1, Slots: 4, Draining: 1, DrainingInFlight: 3, PerWorker: 4}, 1,
			"2 queued, 5 in flight, 1 worker of 4 slots online, 1 draining with 3 in flight: enough"},
		{"only draining work left: scale the rest to zero", Demand{InFlight: 2, Workers: 1, Slots: 4, Draining: 1, DrainingInFlight: 2, PerWorker: 4}, 0,
			"0 queued, 2 in flight, 1 worker of 4 slots online, 1 draining with 2 in flight: want 1 fewer"},
		{"unknown capacity counts one slot per worker", Demand{Queued: 2}, 2, "2 queued, 0 in flight, 0 workers of 0 slots online: want 2 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Decide(tc.d)
			assert.Equal(t, tc.want, s.DesiredWorkers)
			assert.Equal(t, tc.reason, s.Reason)
		})
	}
}

// TestReportAutoscale: the decision from a report reads the queued and in-flight assignments by
// tier and the workers' heartbeats (draining ones apart), and scales a tier with no worker
// from the configured capacity of one.
func TestReportAutoscale(t *testing.T) {
	now := time.Now()
	worker := func(kind, inst string, capacity, inFlight int, draining bool) liveness.Record {
		return liveness.Record{Kind: kind, Instance: inst, Worker: &liveness.WorkerInfo{Capacity: capacity, InFlight: inFlight, Draining: draining}}
	}
	st := func(b assignment.Backend, ph assignment.Phase) assignment.State {
		return assignment.State{Record: assignment.Record{Backend: b, Phase: ph, Transition: ph}}
	}
	r := Build([]liveness.Record{
		worker(liveness.KindPodWorker, "a", 2, 2, false),
		worker(liveness.KindPodWorker, "b", 2, 1, true),
	}, []assignment.State{
		st(assignment.BackendPod, assignment.Running), st(assignment.BackendPod, assignment.Running),
		st(assignment.BackendPod, assignment.Running), st(assignment.BackendPod, assignment.Failed),
		st(assignment.BackendPod, assignment.Queued), st(assignment.BackendPod, assignment.Queued),
		st(assignment.BackendPod, assignment.Queued), st(assignment.BackendVM, assignment.Queued),
	}, now)
	got := r.Decisions(map[assignment.Backend]int{assignment.BackendPod: 8, assignment.BackendVM: 1})
	require.Contains(t, got, assignment.BackendPod)
	pod := got[assignment.BackendPod]
	assert.Equal(t, Demand{Queued: 3, InFlight: 3, Workers: 1, Slots: 2, Draining: 1, DrainingInFlight: 1, PerWorker: 2}, pod.Demand,
		"the workers online, not the configuration, tell one worker's capacity")
	assert.Equal(t, 3, pod.DesiredWorkers, "(3 queued + 3 in flight - 1 on the draining worker) / 2 per worker")
	assert.Equal(t, "3 queued, 3 in flight, 1 worker of 2 slots online, 1 draining with 1 in flight: want 2 more", pod.Reason)
	vm := got[assignment.BackendVM]
	assert.Equal(t, 1, vm.DesiredWorkers, "a queued vm job with no vm worker online")
	assert.Equal(t, 1, vm.PerWorker)
}
