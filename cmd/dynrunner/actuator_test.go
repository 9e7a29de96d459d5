package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

func TestCapacityOfWorkers(t *testing.T) {
	w := func(kind string, capacity, inFlight int, draining bool) liveness.Record {
		return liveness.Record{Kind: kind, Worker: &liveness.WorkerInfo{Capacity: capacity, InFlight: inFlight, Draining: draining}}
	}
	got := capacityOfWorkers([]liveness.Record{
		{Kind: liveness.KindScheduler},
		w(liveness.KindPodWorker, 4, 1, false),
		w(liveness.KindPodWorker, 4, 3, true), // draining: no slot
		w(liveness.KindPodWorker, 2, 0, true),
		w(liveness.KindVMWorker, 1, 0, false),
	})
	assert.Equal(t, map[assignment.Backend]int{assignment.BackendPod: 4, assignment.BackendVM: 1}, got,
		"draining workers add no slot")
	assert.Equal(t, map[assignment.Backend]int{assignment.BackendPod: 0, assignment.BackendVM: 0}, capacityOfWorkers(nil),
		"a tier without workers has capacity 0, so its claims queue instead of dispatching unbounded")

	wc := &workerCapacity{stale: time.Minute}
	_, ok := wc.get()
	assert.False(t, ok, "no reading yet")
	wc.last, wc.at = got, time.Now().Add(-2*time.Minute)
	_, ok = wc.get()
	assert.False(t, ok, "a stale reading does not count")
}
