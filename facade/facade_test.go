package facade_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/facade"

	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/workload"
	dynrunnerv1 "github.com/dynrunner/dynrunner/proto/dynrunner/v1"
	"github.com/dynrunner/dynrunner/proto/dynrunner/v1/dynrunnerv1connect"
)

func runnerClient(hc *http.Client, url, uuid, token string) runnerv1connect.RunnerServiceClient {
	return runnerv1connect.NewRunnerServiceClient(hc, url+"/api/actions", connect.WithInterceptors(
		connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				if uuid != "" {
					req.Header().Set("x-runner-uuid", uuid)
					req.Header().Set("x-runner-token", token)
				}
				return next(ctx, req)
			}
		})))
}

func codeOf(err error) connect.Code { return connect.CodeOf(err) }

// TestFacadeLifecycle walks one environment through the facade: register with its token,
// fetch its task once, report, renew and complete; and checks each refusal on the way.
func TestFacadeLifecycle(t *testing.T) {
	e := newEnv(t)
	srv := e.facadeServer()
	ctx := t.Context()

	e.claim(forgetest.Task(41)) // so that task 42's epoch has a predecessor to be stale with
	st := e.claim(forgetest.Task(42))
	epoch := st.Epoch()
	_, tok := e.start(st)
	me := workload.AssignmentID(e.td, 42, epoch)
	hc := e.client(me)

	// Another assignment's identity cannot redeem this token.
	other := e.client(workload.AssignmentID(e.td, 43, epoch))
	_, err := runnerClient(other, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "x", Token: tok.Secret()}))
	require.Equal(t, connect.CodePermissionDenied, codeOf(err), "register with another assignment's SVID: %v", err)
	// A SPIFFE ID that is no assignment identity is refused outright.
	stranger := e.client(spiffeid.RequireFromPath(e.td, "/somebody/else"))
	_, err = runnerClient(stranger, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "x", Token: tok.Secret()}))
	require.Equal(t, connect.CodePermissionDenied, codeOf(err), "register with a non-assignment SVID: %v", err)
	// A forged token is refused.
	_, err = runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "x", Token: tok.Secret() + "x"}))
	require.Equal(t, connect.CodeUnauthenticated, codeOf(err), "register with a forged token: %v", err)

	reg, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true}))
	require.NoError(t, err)
	// The token is single-use: a replay is refused, decided by JetStream.
	_, err = runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret()}))
	require.Equal(t, connect.CodePermissionDenied, codeOf(err), "replayed token (redeemed): %v", err)
	r := reg.Msg.GetRunner()
	cur, err := e.log.Get(ctx, 42)
	require.NoError(t, err)
	require.Equal(t, assignment.Registered, cur.Phase, "after the replay")
	require.Equal(t, r.GetUuid(), cur.RunnerUUID, "after the replay")
	rc := runnerClient(hc, srv.URL, r.GetUuid(), r.GetToken())
	_, err = runnerClient(hc, srv.URL, r.GetUuid(), "wrong").FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.Equal(t, connect.CodeUnauthenticated, codeOf(err), "fetch with a wrong runner token: %v", err)
	_, err = rc.Declare(ctx, connect.NewRequest(&runnerv1.DeclareRequest{Labels: []string{"pod"}}))
	require.NoError(t, err)
	got, err := rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.NoError(t, err)
	require.Equal(t, int64(42), got.Msg.GetTask().GetId())
	require.Equal(t, "s3cr3t", got.Msg.GetTask().GetSecrets()["API_KEY"])
	// A retried fetch (its first answer lost) gets the same task again, and only this runner
	// can ask: the handover is recorded once.
	again, err := rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.NoError(t, err)
	require.Equal(t, int64(42), again.Msg.GetTask().GetId(), "second fetch")
	cur, err = e.log.Get(ctx, 42)
	require.NoError(t, err)
	require.Equal(t, assignment.Running, cur.Phase, "after a second fetch")

	_, err = rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Rows: []*runnerv1.LogRow{{Content: "hello"}}}))
	require.NoError(t, err)
	_, err = rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7, Rows: []*runnerv1.LogRow{{Content: "x"}}}))
	require.Equal(t, connect.CodePermissionDenied, codeOf(err), "log for another task: %v", err)

	lease := dynrunnerv1connect.NewLeaseServiceClient(hc, srv.URL)
	ren, err := lease.Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(epoch)}))
	require.NoError(t, err)
	require.False(t, ren.Msg.GetEnded())
	// A holder of a stale epoch (an SVID of an earlier handover) is rejected.
	stale := e.client(workload.AssignmentID(e.td, 42, epoch-1))
	_, err = dynrunnerv1connect.NewLeaseServiceClient(stale, srv.URL).Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(epoch - 1)}))
	require.Equal(t, connect.CodeFailedPrecondition, codeOf(err), "stale renew: %v", err)
	// A stale report: the SVID of an earlier epoch, with runner credentials the facade issued
	// for it, naming the runner now registered. Everything checks out but the epoch, so the
	// refusal is the epoch's, and nothing reaches the forge.
	staleEpoch := func() float64 { return testutil.ToFloat64(e.metrics.Refused.WithLabelValues("stale_epoch")) }
	refused := staleEpoch()
	staleToken := facade.RunnerToken(runnerKey, 42, epoch-1, r.GetUuid())
	_, err = runnerClient(stale, srv.URL, r.GetUuid(), staleToken).UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 42}}))
	require.Equal(t, connect.CodeFailedPrecondition, codeOf(err), "stale report: %v", err)
	assert.Equal(t, refused+1, staleEpoch(), "the stale report was refused for its epoch")
	assert.Zero(t, e.forge.Reports(42), "state reports the forge got")

	_, err = rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_SUCCESS}}))
	require.NoError(t, err)
	final, err := e.log.Get(ctx, 42)
	require.NoError(t, err)
	assert.Equal(t, assignment.Completed, final.Phase)
	assert.Equal(t, "success", final.Result)
	assert.Equal(t, epoch, final.Epoch())
	assert.Equal(t, runnerv1.Result_RESULT_SUCCESS, e.forge.Result(42), "upstream result")
	assert.Equal(t, []string{"hello"}, e.forge.Log(42), "upstream log")
	ren, err = lease.Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(epoch)}))
	require.NoError(t, err)
	require.True(t, ren.Msg.GetEnded(), "renew after the end")

	// The attack: after the end, the environment (or the job inside it, which can read the
	// runner's credentials) reports again — a second final state with another result or with
	// injected outputs, a late log. Nothing is forwarded with the resident runner's
	// credentials. The final report of the recorded result is answered (it is what a runner
	// sends again when the first answer was lost) but not forwarded either.
	_, err = rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{
		State:   &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_FAILURE},
		Outputs: map[string]string{"injected": "by the job after its end"},
	}))
	require.Equal(t, connect.CodeFailedPrecondition, codeOf(err), "a final report of another result after the end: %v", err)
	require.ErrorContains(t, err, "nothing more is forwarded")
	_, err = rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{
		State:   &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_SUCCESS},
		Outputs: map[string]string{"injected": "by the job after its end"},
	}))
	require.NoError(t, err, "the final report again")
	_, err = rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Index: 1, Rows: []*runnerv1.LogRow{{Content: "late"}}}))
	require.Equal(t, connect.CodeFailedPrecondition, codeOf(err), "a log after the end: %v", err)
	assert.Equal(t, 1, e.forge.Reports(42), "state reports for task 42: the one final report")
	assert.Equal(t, []string{"hello"}, e.forge.Log(42), "upstream log after the end")
}

// TestFacadeRefusesForeignCA: a client whose SVID comes from another CA fails the handshake.
func TestFacadeRefusesForeignCA(t *testing.T) {
	e := newEnv(t)
	srv := e.facadeServer()
	st := e.claim(forgetest.Task(5))
	foreign, err := workload.LoadOrCreateDevCA(t.TempDir(), e.td)
	require.NoError(t, err)
	src, err := foreign.Source(workload.AssignmentID(e.td, 5, st.Epoch()), time.Hour)
	require.NoError(t, err)
	// The client trusts the real facade (its bundle) but presents a foreign SVID.
	cfg := workload.ClientTLSConfig(bundleOverride{src, e.ca}, workload.FacadeID(e.td))
	_, err = runnerClient(e.clientTLS(cfg), srv.URL, "", "").Register(t.Context(), connect.NewRequest(&runnerv1.RegisterRequest{Token: "x"}))
	require.Error(t, err, "foreign SVID")
	require.NotEqual(t, connect.CodePermissionDenied, codeOf(err), "foreign SVID: %v, want a failed handshake", err)
	// Without any client certificate the handshake fails too.
	_, err = runnerClient(&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}, srv.URL, "", "").Register(t.Context(), connect.NewRequest(&runnerv1.RegisterRequest{Token: "x"}))
	require.Error(t, err, "a client without an SVID was served")
}

// TestFacadeGuestListener: a microVM guest without an SVID registers with its token over
// server-authenticated TLS and works with the runner credentials it got; a pod assignment is
// never served there.
func TestFacadeGuestListener(t *testing.T) {
	e := newEnv(t)
	srv := e.guestServer()
	ctx := t.Context()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: workload.GuestClientTLSConfig(e.ca.Bundle(), workload.FacadeID(e.td)), ForceAttemptHTTP2: true}}

	pod := e.claim(forgetest.Task(60))
	_, podTok := e.start(pod)
	_, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "vm", Token: podTok.Secret()}))
	require.Equal(t, connect.CodePermissionDenied, codeOf(err), "pod token on the guest listener: %v", err)

	vm := e.claimOn(forgetest.Task(61), assignment.BackendVM)
	_, tok := e.start(vm)
	_, err = runnerClient(hc, srv.URL, "", "").FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.Equal(t, connect.CodeUnauthenticated, codeOf(err), "guest fetch without credentials: %v", err)
	reg, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "vm", Token: tok.Secret()}))
	require.NoError(t, err)
	_, err = runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "vm", Token: tok.Secret()}))
	require.Equal(t, connect.CodePermissionDenied, codeOf(err), "replayed guest token: %v", err)
	r := reg.Msg.GetRunner()
	rc := runnerClient(hc, srv.URL, r.GetUuid(), r.GetToken())
	got, err := rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.NoError(t, err)
	require.Equal(t, int64(61), got.Msg.GetTask().GetId(), "guest fetch")
	// A forged token naming another assignment fails the HMAC.
	forged := strings.Replace(r.GetToken(), "61.", "60.", 1)
	_, err = runnerClient(hc, srv.URL, r.GetUuid(), forged).UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 60}))
	require.Equal(t, connect.CodeUnauthenticated, codeOf(err), "a forged runner token: %v", err)
	_, err = rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 61, Result: runnerv1.Result_RESULT_SUCCESS}}))
	require.NoError(t, err)
}

// TestFacadeRegisterBeforeStartedIsRetryable: an environment faster than its worker's
// `started` record is told to retry, not refused for good.
func TestFacadeRegisterBeforeStartedIsRetryable(t *testing.T) {
	e := newEnv(t)
	srv := e.facadeServer()
	st := e.claim(forgetest.Task(70))
	tok, err := e.issuer.Issue(st.Task, st.Epoch(), captoken.PurposeRegister, st.PickupDeadline)
	require.NoError(t, err)
	hc := e.client(workload.AssignmentID(e.td, 70, st.Epoch()))
	_, err = runnerClient(hc, srv.URL, "", "").Register(t.Context(), connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret()}))
	require.Equal(t, connect.CodeUnavailable, codeOf(err), "register before started (retry): %v", err)
}

// TestFacadeAnswersLateReportsFromJetStream: an environment reports long after its assignment
// ended, when the controller's view (live assignments and the last eventlog.MaxEnded ended
// ones) no longer holds it. The facade reads the assignment from JetStream and refuses the
// report as it refuses any report after the end; nothing reaches the forge.
func TestFacadeAnswersLateReportsFromJetStream(t *testing.T) {
	e := newEnv(t)
	srv := e.facadeServer()
	ctx := t.Context()
	st := e.claim(forgetest.Task(42))
	_, tok := e.start(st)
	hc := e.client(workload.AssignmentID(e.td, 42, st.Epoch()))
	reg, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true}))
	require.NoError(t, err)
	r := reg.Msg.GetRunner()
	rc := runnerClient(hc, srv.URL, r.GetUuid(), r.GetToken())
	_, err = rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.NoError(t, err)
	_, err = rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_SUCCESS}}))
	require.NoError(t, err)
	require.Equal(t, 1, e.forge.Reports(42))

	// More assignments end than the view keeps: 42 falls out of it.
	require.NoError(t, e.log.GenerateEnded(ctx, 1000, eventlog.MaxEnded+1, time.Now()))
	require.Eventually(t, func() bool { _, ok := e.view.Get(42); return !ok }, 20*time.Second, 10*time.Millisecond,
		"the view still holds task 42")

	_, err = rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{
		State: &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_FAILURE}, Outputs: map[string]string{"late": "x"}}))
	require.Equal(t, connect.CodeFailedPrecondition, codeOf(err), "a late final report: %v", err)
	require.ErrorContains(t, err, "nothing more is forwarded")
	// The final report of the recorded result is answered from JetStream, not forwarded.
	_, err = rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{
		State: &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_SUCCESS}, Outputs: map[string]string{"late": "x"}}))
	require.NoError(t, err, "the final report again")
	_, err = rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Index: 1, Rows: []*runnerv1.LogRow{{Content: "late"}}}))
	require.Equal(t, connect.CodeFailedPrecondition, codeOf(err), "a late log: %v", err)
	ren, err := dynrunnerv1connect.NewLeaseServiceClient(hc, srv.URL).Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(st.Epoch())}))
	require.NoError(t, err)
	assert.True(t, ren.Msg.GetEnded(), "a late renewal hears that the assignment ended")
	assert.Equal(t, 1, e.forge.Reports(42), "state reports the forge got")
	_, ok := e.view.Get(42)
	assert.False(t, ok, "the answers came from JetStream, not the view")
}
