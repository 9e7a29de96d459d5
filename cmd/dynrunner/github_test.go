package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// TestGitHubTiers: GitHub slots are served on every enabled tier, one scale set each; the vm
// tier included, whose guests run the runner of their image.
func TestGitHubTiers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tiers []assignment.Backend
		want  []assignment.Backend
	}{
		{"pod", []assignment.Backend{assignment.BackendPod}, []assignment.Backend{assignment.BackendPod}},
		{"vm", []assignment.Backend{assignment.BackendVM}, []assignment.Backend{assignment.BackendVM}},
		{"both", []assignment.Backend{assignment.BackendPod, assignment.BackendVM}, []assignment.Backend{assignment.BackendPod, assignment.BackendVM}},
		{"none", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, gitHubTiers(tc.tiers))
		})
	}
}
