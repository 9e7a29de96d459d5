package assignment

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStateLiveActive(t *testing.T) {
	tests := []struct {
		name   string
		phase  Phase
		live   bool
		active bool
	}{
		{name: "claimed", phase: Claimed, live: true, active: true},
		{name: "dispatched", phase: Dispatched, live: true, active: true},
		{name: "started", phase: Started, live: true, active: true},
		{name: "registered", phase: Registered, live: true, active: true},
		{name: "running", phase: Running, live: true, active: true},
		{name: "failed, not yet reported", phase: Failed, live: true, active: false},
		{name: "completed", phase: Completed, live: false, active: false},
		{name: "closed", phase: Closed, live: false, active: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Record: Record{Transition: tt.phase, Phase: tt.phase}}
			assert.Equal(t, tt.live, s.Live(), "Live")
			assert.Equal(t, tt.active, s.Active(), "Active")
		})
	}
}
