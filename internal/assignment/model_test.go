package assignment

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStatePredicates(t *testing.T) {
	tests := []struct {
		name     string
		phase    Phase
		live     bool
		active   bool
		inFlight bool
		waiting  bool
	}{
		{name: "queued", phase: Queued, live: true, active: true, inFlight: false, waiting: true},
		{name: "claimed", phase: Claimed, live: true, active: true, inFlight: true},
		{name: "dispatched", phase: Dispatched, live: true, active: true, inFlight: true},
		{name: "started", phase: Started, live: true, active: true, inFlight: true},
		{name: "registered", phase: Registered, live: true, active: true, inFlight: true},
		{name: "running", phase: Running, live: true, active: true, inFlight: true},
		{name: "failed, not yet reported", phase: Failed, live: true, active: false},
		{name: "completed", phase: Completed, live: false, active: false},
		{name: "closed", phase: Closed, live: false, active: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Record: Record{Transition: tt.phase, Phase: tt.phase}}
			assert.Equal(t, tt.live, s.Live(), "Live")
			assert.Equal(t, tt.active, s.Active(), "Active")
			assert.Equal(t, tt.inFlight, s.InFlight(), "InFlight")
			assert.Equal(t, tt.inFlight, InFlightPhase(tt.phase), "InFlightPhase")
			assert.Equal(t, tt.waiting, s.Waiting(), "Waiting")
			// A live assignment that can run either holds capacity or waits for it, never both.
			assert.Equal(t, tt.active, s.InFlight() != s.Waiting(), "Active = InFlight xor Waiting")
		})
	}
}
