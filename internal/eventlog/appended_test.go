package eventlog

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// TestAppendedTakesOnlyWhatWasSent: a remembered append is returned only for its sequence,
// subject and bytes; a message that differs in any of them (a forgery at that sequence, a
// stream recreated since) is left to be verified and decoded.
func TestAppendedTakesOnlyWhatWasSent(t *testing.T) {
	var a appended
	st := assignment.State{Record: assignment.Record{Task: 7, Transition: assignment.Claimed}, Seq: 42}
	subject := RecordSubject(7, assignment.Claimed)
	a.add(subject, []byte(`{"task_id":7}`), st)

	tests := []struct {
		name    string
		seq     uint64
		subject string
		data    string
		ok      bool
	}{
		{"what was sent", 42, subject, `{"task_id":7}`, true},
		{"other sequence", 43, subject, `{"task_id":7}`, false},
		{"other subject", 42, RecordSubject(8, assignment.Claimed), `{"task_id":7}`, false},
		{"other bytes", 42, subject, `{"task_id":8}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := a.get(tt.seq, tt.subject, []byte(tt.data))
			assert.Equal(t, tt.ok, ok)
			if tt.ok {
				assert.Equal(t, st, got)
			}
		})
	}
	// Taken once, it is forgotten: its bytes are not held until maxAppended more appends.
	assert.Empty(t, a.recs, "a taken append is still remembered")
	_, ok := a.get(42, subject, []byte(`{"task_id":7}`))
	assert.False(t, ok, "an append taken twice")
}

// TestAppendedIsBounded: beyond maxAppended the oldest appends are forgotten.
func TestAppendedIsBounded(t *testing.T) {
	var a appended
	for seq := uint64(1); seq <= maxAppended+10; seq++ {
		a.add("s", nil, assignment.State{Seq: seq})
	}
	assert.Len(t, a.recs, maxAppended)
	_, ok := a.get(10, "s", nil)
	assert.False(t, ok, "forgotten")
	_, ok = a.get(maxAppended+10, "s", nil)
	assert.True(t, ok, "remembered")
}
