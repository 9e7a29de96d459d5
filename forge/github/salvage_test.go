package github

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseLeniently(t *testing.T) {
	const good = `{"messageType": "JobStarted", "runnerRequestId": 5, "jobId": "j", "runnerId": 3, "runnerName": "r"}`
	for _, tc := range []struct {
		name    string
		raw     string
		id      int
		whole   bool // dropped whole
		bad     int  // parts dropped
		started int  // JobStarted messages kept
		stats   bool
		err     bool
	}{
		{name: "well-formed", raw: `{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": "[` + esc(good) + `]", "statistics": {"totalAssignedJobs": 2}}`,
			id: 7, started: 1, stats: true},
		{name: "one bad job message of three", raw: `{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": "[` +
			esc(good) + `,` + esc(`{"messageType": "JobCompleted", "runnerId": "x"}`) + `,` + esc(good) + `]", "statistics": {}}`,
			id: 7, bad: 1, started: 2, stats: true},
		{name: "a job message without a type object", raw: `{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": "[1]"}`,
			id: 7, bad: 1},
		{name: "bad statistics", raw: `{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": "[]", "statistics": "many"}`,
			id: 7, bad: 1},
		{name: "no statistics", raw: `{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": "[]", "statistics": null}`, id: 7},
		{name: "body not an array", raw: `{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": "{}"}`, id: 7, whole: true},
		{name: "body not a string", raw: `{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": []}`, id: 7, whole: true},
		{name: "unknown type", raw: `{"messageId": 7, "messageType": "SomethingNew", "body": "[]"}`, id: 7, whole: true},
		{name: "not JSON, id readable", raw: `{"messageId": 7, "messageType": "RunnerScal`, id: 7, whole: true},
		{name: "not JSON, no id", raw: `{"messageType": "RunnerScal`, err: true},
		{name: "no id", raw: `{"messageType": "RunnerScaleSetJobMessages", "body": "[]"}`, err: true},
		{name: "a negative id", raw: `{"messageId": -1}`, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseLeniently([]byte(tc.raw))
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.id, r.id)
			assert.Equal(t, tc.whole, r.whole != nil, "dropped whole: %v", r.whole)
			if tc.whole {
				return
			}
			assert.Len(t, r.bad, tc.bad)
			assert.Len(t, r.msg.JobStartedMessages, tc.started)
			assert.Equal(t, tc.stats, r.msg.Statistics != nil)
			assert.Equal(t, tc.id, r.msg.MessageID)
		})
	}
}

// esc escapes s for a JSON string.
func esc(s string) string { return strings.ReplaceAll(s, `"`, `\"`) }

// FuzzParseLeniently: whatever the queue answers, parseLeniently either reads a positive id
// or fails; what it keeps to handle carries that id, and is nothing when it drops the whole.
func FuzzParseLeniently(f *testing.F) {
	f.Add([]byte(`{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": "[{\"messageType\": \"JobAvailable\"}]"}`))
	f.Add([]byte(`{"messageId": 7, "messageType": "RunnerScal`))
	f.Add([]byte(`{"messageId": 7, "messageType": "RunnerScaleSetJobMessages", "body": "[1, {}]", "statistics": 3}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := parseLeniently(raw)
		if err != nil {
			require.Nil(t, r)
			return
		}
		require.Positive(t, r.id)
		if r.whole == nil {
			require.NotNil(t, r.msg)
			require.Equal(t, r.id, r.msg.MessageID)
		}
	})
}
