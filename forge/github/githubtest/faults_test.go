package githubtest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
)

// TestServerErrorOnce shows a 5xx answered once and the client's retry getting through.
func TestServerErrorOnce(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)

	srv.FailOnce(githubtest.OpGenerateJITConfig, http.StatusServiceUnavailable)
	jit, err := c.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: "slot-1"}, set.ID)
	require.NoError(t, err)
	assert.Equal(t, "slot-1", jit.Runner.Name)
	assert.Equal(t, 2, srv.Requests(githubtest.OpGenerateJITConfig), "one fault, one retry")
	assert.Equal(t, 1, srv.Counts().InjectedFaults)
	assert.Len(t, srv.Runners(), 1, "the failed attempt registered no runner")
}

// TestServerErrorWithoutRetry shows the error reaching the caller when the client does not retry.
func TestServerErrorWithoutRetry(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv, fastRetries(0))
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)

	srv.FailOnce(githubtest.OpGetMessage, http.StatusInternalServerError)
	_, err = sess.GetMessage(ctx, 0, 1)
	require.Error(t, err)
	msg, err := sess.GetMessage(ctx, 0, 1)
	require.NoError(t, err, "the fault answered once")
	assert.Nil(t, msg)
}

// TestMalformedMessages sends what GitHub should not: each yields the client's error, not a
// panic, and leaves the message in the queue for the listener to delete.
func TestMalformedMessages(t *testing.T) {
	tests := []struct {
		name    string
		typ     string
		body    string
		checkFn func(t *testing.T, err error)
	}{
		{"body not JSON", "RunnerScaleSetJobMessages", `[{"messageType":`, func(t *testing.T, err error) {
			var syntax *json.SyntaxError
			require.ErrorAs(t, err, &syntax)
		}},
		{"body not an array", "RunnerScaleSetJobMessages", `{"messageType":"JobAvailable"}`, func(t *testing.T, err error) {
			var typ *json.UnmarshalTypeError
			require.ErrorAs(t, err, &typ)
		}},
		{"job message of the wrong shape", "RunnerScaleSetJobMessages", `[{"messageType":"JobAvailable","runnerRequestId":"one"}]`, func(t *testing.T, err error) {
			var typ *json.UnmarshalTypeError
			require.ErrorAs(t, err, &typ)
		}},
		{"unknown message type", "SomethingElse", `[]`, func(t *testing.T, err error) {
			require.ErrorContains(t, err, "unsupported message type")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			srv := newServer(t, nil)
			c := appClient(t, srv)
			set := podScaleSet(ctx, t, c)
			sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
			require.NoError(t, err)
			id, err := srv.QueueRawMessage(set.ID, tt.typ, tt.body)
			require.NoError(t, err)

			msg, err := sess.GetMessage(ctx, 0, 1)
			require.Nil(t, msg)
			tt.checkFn(t, err)
			assert.Equal(t, 1, srv.PendingMessages(set.ID))
			require.NoError(t, sess.DeleteMessage(ctx, id), "the listener can drop the bad message")
			assert.Zero(t, srv.PendingMessages(set.ID))
		})
	}
}

// TestMalformedResponse answers a poll with a truncated envelope and an unknown job message
// type inside a good one (which the client skips).
func TestMalformedResponse(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)

	srv.InjectFault(githubtest.OpGetMessage, githubtest.Fault{Status: http.StatusOK, Body: `{"messageId":1,`})
	_, err = sess.GetMessage(ctx, 0, 1)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)

	_, err = srv.QueueRawMessage(set.ID, "RunnerScaleSetJobMessages", `[{"messageType":"JobFromTheFuture"}]`)
	require.NoError(t, err)
	msg, err := sess.GetMessage(ctx, 0, 1)
	require.NoError(t, err)
	require.NotNil(t, msg)
	assert.Empty(t, msg.JobAvailableMessages)
	assert.NotNil(t, msg.Statistics)
}

// TestUnknownIDs shows the client's errors for ids the fake does not know.
func TestUnknownIDs(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	_, err := c.GetRunner(ctx, 99)
	require.ErrorIs(t, err, scaleset.RunnerNotFoundError)
	require.ErrorIs(t, c.RemoveRunner(ctx, 99), scaleset.RunnerNotFoundError)
	_, err = c.GetRunnerScaleSetByID(ctx, 99)
	require.ErrorContains(t, err, "404")
	_, err = c.MessageSessionClient(ctx, 99, "replica-a")
	require.ErrorContains(t, err, "404")
	_, err = c.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: "x"}, 99)
	require.ErrorContains(t, err, "404")
	_, err = srv.QueueRawMessage(99, "RunnerScaleSetJobMessages", "[]")
	require.ErrorIs(t, err, githubtest.ErrUnknownScaleSet)
	_, err = githubtest.DecodeJITConfig("not base64!")
	require.Error(t, err)
}

// TestScaleSetUpdateAndDelete covers the rest of scale set CRUD.
func TestScaleSetUpdateAndDelete(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.RunnerGroups = []string{"dynrunner"} })
	c := appClient(t, srv)
	group, err := c.GetRunnerGroupByName(ctx, "dynrunner")
	require.NoError(t, err)
	set := podScaleSet(ctx, t, c)
	_, err = c.CreateRunnerScaleSet(ctx, &scaleset.RunnerScaleSet{Name: "dynrunner-pod", Labels: []scaleset.Label{{Name: "pod"}}})
	require.ErrorContains(t, err, "409", "a name is unique in its group")

	updated, err := c.UpdateRunnerScaleSet(ctx, set.ID, &scaleset.RunnerScaleSet{RunnerGroupID: group.ID, Labels: []scaleset.Label{{Name: "self-hosted"}, {Name: "pod"}, {Name: "x64"}}})
	require.NoError(t, err)
	assert.Equal(t, "dynrunner", updated.RunnerGroupName)
	assert.Len(t, updated.Labels, 3)
	_, err = c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)

	require.NoError(t, c.DeleteRunnerScaleSet(ctx, set.ID))
	assert.Empty(t, srv.ScaleSets())
	assert.Empty(t, srv.Sessions(), "the scale set's session went with it")
	got, err := c.GetRunnerScaleSet(ctx, group.ID, "dynrunner-pod")
	require.NoError(t, err)
	assert.Nil(t, got)
}

// TestWithheldAnswer: a withheld request takes effect, and its client hears nothing until it
// gives up.
func TestWithheldAnswer(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)
	stalled := make(chan struct{})
	srv.InjectFault(githubtest.OpGenerateJITConfig, githubtest.Fault{Withhold: true, Stalled: stalled})
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err := c.GenerateJitRunnerConfig(short, &scaleset.RunnerScaleSetJitRunnerSetting{Name: "withheld"}, set.ID)
	require.Error(t, err, "a withheld answer arrived")
	<-stalled
	rn, err := c.GetRunnerByName(ctx, "withheld")
	require.NoError(t, err)
	require.NotNil(t, rn, "the withheld request did not take effect")
}
