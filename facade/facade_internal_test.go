package facade

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/dynrunner/dynrunner/internal/assignment"
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
