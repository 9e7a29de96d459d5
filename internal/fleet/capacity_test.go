package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

func TestCapacity(t *testing.T) {
	w := func(kind string, capacity, inFlight int, draining bool) liveness.Record {
		return liveness.Record{Kind: kind, Worker: &liveness.WorkerInfo{Capacity: capacity, InFlight: inFlight, Draining: draining}}
	}
	tests := []struct {
		name       string
		components []liveness.Record
		want       map[assignment.Backend]int
	}{
		{
			name: "a tier without workers has capacity 0, so its claims queue instead of dispatching unbounded",
			want: map[assignment.Backend]int{assignment.BackendPod: 0, assignment.BackendVM: 0},
		},
		{
			name: "draining workers add no slot",
			components: []liveness.Record{
				{Kind: liveness.KindScheduler},
				w(liveness.KindPodWorker, 4, 1, false),
				w(liveness.KindPodWorker, 4, 3, true),
				w(liveness.KindPodWorker, 2, 0, true),
				w(liveness.KindVMWorker, 1, 0, false),
			},
			want: map[assignment.Backend]int{assignment.BackendPod: 4, assignment.BackendVM: 1},
		},
		{
			name:       "in flight does not lower a worker's slots",
			components: []liveness.Record{w(liveness.KindPodWorker, 4, 4, false), w(liveness.KindVMWorker, 2, 2, false), w(liveness.KindVMWorker, 3, 0, false)},
			want:       map[assignment.Backend]int{assignment.BackendPod: 4, assignment.BackendVM: 5},
		},
		{
			name:       "components without a worker record add nothing",
			components: []liveness.Record{{Kind: liveness.KindFacade}, {Kind: liveness.KindPodWorker}},
			want:       map[assignment.Backend]int{assignment.BackendPod: 0, assignment.BackendVM: 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Capacity(tt.components))
		})
	}
}

func TestCapacityFollowerGet(t *testing.T) {
	f := &CapacityFollower{Stale: time.Minute}
	_, ok := f.Get()
	assert.False(t, ok, "no reading yet")
	want := map[assignment.Backend]int{assignment.BackendPod: 4}
	f.last, f.at = want, time.Now()
	got, ok := f.Get()
	assert.True(t, ok, "a fresh reading")
	assert.Equal(t, want, got)
	f.at = time.Now().Add(-2 * time.Minute)
	_, ok = f.Get()
	assert.False(t, ok, "a stale reading does not count")
}
