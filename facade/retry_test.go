package facade_test

import (
	"strings"
	"testing"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// TestFacadeAnswersRequestsSentAgainToAnotherFacade: an environment whose facade died
// mid-request sends the request again to another facade (executor.Failover). Each request of
// the runner API is answered as the first was, from JetStream, without duplicating anything
// upstream; and what looks like a request sent again but comes from anyone else is refused.
func TestFacadeAnswersRequestsSentAgainToAnotherFacade(t *testing.T) {
	e := newEnv(t)
	first, second := e.facadeServer(), e.facadeServer()
	ctx := t.Context()

	st := e.claim(forgetest.Task(42))
	epoch := st.Epoch()
	_, tok := e.start(st)
	hc := e.client(workload.AssignmentID(e.td, 42, epoch))
	key := strings.Repeat("ab", 32)
	register := func(url, key string) (*connect.Response[runnerv1.RegisterResponse], error) {
		req := connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Labels: []string{"pod"}, Ephemeral: true})
		if key != "" {
			req.Header().Set(facade.RegisterKeyHeader, key)
		}
		return runnerClient(hc, url, "", "").Register(ctx, req)
	}

	// Register: the first facade records it (and, in the story, dies before answering); the
	// second answers the same registration again.
	reg, err := register(first.URL, key)
	require.NoError(t, err)
	again, err := register(second.URL, key)
	require.NoError(t, err, "the same environment's Register again")
	assert.Equal(t, reg.Msg.GetRunner().GetUuid(), again.Msg.GetRunner().GetUuid())
	assert.Equal(t, reg.Msg.GetRunner().GetToken(), again.Msg.GetRunner().GetToken())
	// Anyone else with the token: no register key, or another one, is a replay.
	for name, k := range map[string]string{"no key": "", "another key": strings.Repeat("cd", 32), "a short key": "abab"} {
		_, err := register(second.URL, k)
		require.Equal(t, connect.CodePermissionDenied, codeOf(err), "%s: %v", name, err)
	}
	cur, err := e.log.Get(ctx, 42)
	require.NoError(t, err)
	assert.Equal(t, reg.Msg.GetRunner().GetUuid(), cur.RunnerUUID, "one registration recorded")

	r := reg.Msg.GetRunner()
	rc1, rc2 := runnerClient(hc, first.URL, r.GetUuid(), r.GetToken()), runnerClient(hc, second.URL, r.GetUuid(), r.GetToken())
	got, err := rc1.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.NoError(t, err)
	require.Equal(t, int64(42), got.Msg.GetTask().GetId())
	got, err = rc2.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.NoError(t, err)
	require.Equal(t, int64(42), got.Msg.GetTask().GetId(), "the task handed again through the other facade")

	// UpdateLog: rows are indexed; a batch sent again with the same index adds nothing, and
	// the log stays complete and in order.
	rows := func(from, to int) []*runnerv1.LogRow {
		var out []*runnerv1.LogRow
		for i := from; i < to; i++ {
			out = append(out, &runnerv1.LogRow{Content: "line " + string(rune('a'+i))})
		}
		return out
	}
	ack, err := rc1.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Index: 0, Rows: rows(0, 3)}))
	require.NoError(t, err)
	require.Equal(t, int64(3), ack.Msg.GetAckIndex())
	ack, err = rc2.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Index: 0, Rows: rows(0, 3)}))
	require.NoError(t, err, "the same batch again")
	require.Equal(t, int64(3), ack.Msg.GetAckIndex())
	ack, err = rc2.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Index: 3, Rows: rows(3, 5), NoMore: true}))
	require.NoError(t, err)
	require.Equal(t, int64(5), ack.Msg.GetAckIndex())
	var want []string
	for _, r := range rows(0, 5) {
		want = append(want, r.GetContent())
	}
	assert.Equal(t, want, e.forge.Log(42))

	// The final UpdateTask: recorded by the first facade, sent again to the second.
	final := func() *connect.Request[runnerv1.UpdateTaskRequest] {
		return connect.NewRequest(&runnerv1.UpdateTaskRequest{
			State: &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_SUCCESS}, Outputs: map[string]string{"b": "2", "a": "1"},
		})
	}
	_, err = rc1.UpdateTask(ctx, final())
	require.NoError(t, err)
	reports := e.forge.Reports(42)
	// The runner closes its log again first, then reports its final state again.
	ack, err = rc2.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Index: 5, NoMore: true}))
	require.NoError(t, err, "the log closed again")
	assert.Equal(t, int64(5), ack.Msg.GetAckIndex())
	resp, err := rc2.UpdateTask(ctx, final())
	require.NoError(t, err, "the final report again")
	assert.Equal(t, runnerv1.Result_RESULT_SUCCESS, resp.Msg.GetState().GetResult())
	assert.Equal(t, []string{"a", "b"}, resp.Msg.GetSentOutputs())
	assert.Equal(t, reports, e.forge.Reports(42), "nothing forwarded again")
	assert.Equal(t, want, e.forge.Log(42))
	cur, err = e.log.Get(ctx, 42)
	require.NoError(t, err)
	assert.Equal(t, assignment.Completed, cur.Phase)
	assert.Equal(t, "success", cur.Result)

	// After the end, a log with rows is refused, through any facade.
	_, err = rc2.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Index: 5, Rows: rows(5, 6)}))
	require.Equal(t, connect.CodeFailedPrecondition, codeOf(err), "a late log: %v", err)
	// And a Register after the end is refused, register key or not.
	_, err = register(second.URL, key)
	require.Equal(t, connect.CodeFailedPrecondition, codeOf(err), "register after the end: %v", err)
}
