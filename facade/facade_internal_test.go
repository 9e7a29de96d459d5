package facade

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
)

// FuzzParseRunnerToken: the facade reads the assignment a runner token names (its HMAC is
// checked apart): a token it issued names its own assignment; anything else that parses names a
// valid task and epoch spelled canonically at its start.
func FuzzParseRunnerToken(f *testing.F) {
	f.Add(int64(42), uint64(7), "0a4d4f1e-1111-4222-8333-444455556666", "42.7.abc")
	f.Add(int64(1), uint64(1), "", "1.x")
	f.Add(int64(9), uint64(3), "u", "..")
	f.Fuzz(func(t *testing.T, task int64, epoch uint64, uuid, wire string) {
		fc := &Facade{cfg: Config{RunnerKey: []byte("runner-key-runner-key-runner-key")}}
		if task > 0 && epoch > 0 {
			c := caller{task: assignment.TaskID(task), epoch: assignment.Epoch(epoch)}
			gotTask, gotEpoch, ok := parseRunnerToken(fc.runnerToken(c, uuid))
			assert.True(t, ok)
			assert.Equal(t, c.task, gotTask)
			assert.Equal(t, c.epoch, gotEpoch)
		}
		if gotTask, gotEpoch, ok := parseRunnerToken(wire); ok {
			assert.Positive(t, int64(gotTask))
			assert.NotZero(t, uint64(gotEpoch))
			assert.True(t, strings.HasPrefix(wire, gotTask.String()+"."+gotEpoch.String()+"."), "%q names task %d epoch %d", wire, gotTask, gotEpoch)
		}
	})
}

// TestTokenExpired: the refusal of an expired registration token names the assignment, the
// instant and the deadline that passed, counted from the claim or, for a claim that queued,
// from its admission.
func TestTokenExpired(t *testing.T) {
	issuer, err := captoken.NewIssuer([]byte("fedcba9876543210fedcba9876543210"))
	require.NoError(t, err)
	deadline := time.Date(2026, 12, 5, 23, 2, 0, 0, time.UTC)
	tok, err := issuer.Issue(12, 57, captoken.PurposeRegister, deadline)
	require.NoError(t, err)
	claimed := assignment.State{Record: assignment.Record{Task: 12, Epoch: 57, ClaimedAt: deadline.Add(-2 * time.Minute), PickupDeadline: deadline}}
	admitted := claimed
	admitted.AdmittedAt = claimed.ClaimedAt.Add(time.Minute)
	tests := []struct {
		name string
		st   assignment.State
		want string
	}{
		{name: "never queued", st: claimed, want: "dynrunner facade: registration token of task 12 epoch 57 expired at 2026-12-05T23:02:00Z: " +
			"the assignment's pickup deadline (PICKUP_SECS, counted from its claim) passed before the environment registered"},
		{name: "queued, then admitted", st: admitted, want: "dynrunner facade: registration token of task 12 epoch 57 expired at 2026-12-05T23:02:00Z: " +
			"the assignment's pickup deadline (PICKUP_SECS, counted from its admission) passed before the environment registered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.EqualError(t, tokenExpired(tok, tt.st), tt.want)
		})
	}
}
