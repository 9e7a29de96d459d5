package github

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPlan(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	idle := func(id int64, age int) Slot { return Slot{ID: id, Since: t0.Add(-time.Duration(age) * time.Minute)} }
	bound := func(id int64) Slot { return Slot{ID: id, Bound: true, Since: t0.Add(-time.Hour)} }
	for _, tc := range []struct {
		name string
		in   Snapshot
		want Steps
	}{
		{"nothing to do", Snapshot{Capacity: 4}, Steps{}},
		{"acquire what is available, create for what is assigned", Snapshot{Assigned: 2, Available: []int64{7, 8}, Capacity: 4},
			Steps{Acquire: []int64{7, 8}, Create: 2}},
		{"never above capacity", Snapshot{Assigned: 9, Capacity: 3, Slots: []Slot{bound(1)}}, Steps{Create: 2}},
		{"at capacity: nothing more", Snapshot{Assigned: 9, Capacity: 2, Slots: []Slot{bound(1), idle(2, 1)}}, Steps{}},
		{"one slot per assigned job", Snapshot{Assigned: 2, Capacity: 4, Slots: []Slot{bound(1), idle(2, 1)}}, Steps{}},
		{"a job was cancelled: retire the youngest idle slot", Snapshot{Assigned: 1, Capacity: 4, Slots: []Slot{idle(1, 5), idle(2, 1), idle(3, 3)}},
			Steps{Retire: []int64{2, 3}}},
		{"never retire a slot with a job", Snapshot{Assigned: 0, Capacity: 4, Slots: []Slot{bound(1), bound(2), idle(3, 1)}},
			Steps{Retire: []int64{3}}},
		{"capacity shrank below the bound slots: retire only idle ones", Snapshot{Assigned: 5, Capacity: 1, Slots: []Slot{bound(1), bound(2), idle(3, 2)}},
			Steps{Retire: []int64{3}}},
		{"negative statistics are nothing", Snapshot{Assigned: -3, Capacity: 4}, Steps{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Plan(tc.in))
		})
	}
}

// TestPlanNeverRetiresABoundSlot and never plans above capacity, over every mix of bound and
// idle slots, assigned counts and capacities up to 5.
func TestPlanNeverRetiresABoundSlot(t *testing.T) {
	for n := 0; n <= 5; n++ {
		for mask := 0; mask < 1<<n; mask++ {
			var slots []Slot
			for i := range n {
				slots = append(slots, Slot{ID: int64(i + 1), Bound: mask&(1<<i) != 0})
			}
			for assigned := 0; assigned <= 6; assigned++ {
				for capacity := 0; capacity <= 5; capacity++ {
					steps := Plan(Snapshot{Assigned: assigned, Capacity: capacity, Slots: slots})
					for _, id := range steps.Retire {
						assert.False(t, slots[id-1].Bound, "retired bound slot %d (%d slots, mask %b, assigned %d, capacity %d)", id, n, mask, assigned, capacity)
					}
					after := n + steps.Create - len(steps.Retire)
					if steps.Create > 0 {
						assert.LessOrEqual(t, after, capacity, "planned above capacity")
						assert.Empty(t, steps.Retire, "created and retired at once")
					}
				}
			}
		}
	}
}
