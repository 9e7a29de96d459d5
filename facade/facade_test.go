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
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
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
	if codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("register with another assignment's SVID: %v, want permission denied", err)
	}
	// A SPIFFE ID that is no assignment identity is refused outright.
	stranger := e.client(spiffeid.RequireFromPath(e.td, "/somebody/else"))
	_, err = runnerClient(stranger, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "x", Token: tok.Secret()}))
	if codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("register with a non-assignment SVID: %v, want permission denied", err)
	}
	// A forged token is refused.
	_, err = runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "x", Token: tok.Secret() + "x"}))
	if codeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("register with a forged token: %v, want unauthenticated", err)
	}

	reg, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true}))
	if err != nil {
		t.Fatal(err)
	}
	// The token is single-use: a replay is refused, decided by JetStream.
	_, err = runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret()}))
	if codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("replayed token: %v, want permission denied (token redeemed)", err)
	}
	r := reg.Msg.GetRunner()
	if cur, _ := e.log.Get(ctx, 42); cur.RunnerUUID != r.GetUuid() || cur.Phase != assignment.Registered {
		t.Fatalf("after the replay the assignment is %s with runner %s, want registered with %s", cur.Phase, cur.RunnerUUID, r.GetUuid())
	}
	rc := runnerClient(hc, srv.URL, r.GetUuid(), r.GetToken())
	if _, err := runnerClient(hc, srv.URL, r.GetUuid(), "wrong").FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); codeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("fetch with a wrong runner token: %v, want unauthenticated", err)
	}
	if _, err := rc.Declare(ctx, connect.NewRequest(&runnerv1.DeclareRequest{Labels: []string{"pod"}})); err != nil {
		t.Fatal(err)
	}
	got, err := rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.GetTask().GetId() != 42 || got.Msg.GetTask().GetSecrets()["API_KEY"] != "s3cr3t" {
		t.Fatalf("fetched task = %v", got.Msg.GetTask())
	}
	// A retried fetch (its first answer lost) gets the same task again, and only this runner
	// can ask: the handover is recorded once.
	again, err := rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if err != nil || again.Msg.GetTask().GetId() != 42 {
		t.Fatalf("second fetch = %v, %v; want the same task", again.Msg.GetTask(), err)
	}
	if cur, _ := e.log.Get(ctx, 42); cur.Phase != assignment.Running {
		t.Fatalf("after a second fetch the assignment is %s, want running", cur.Phase)
	}

	if _, err := rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Rows: []*runnerv1.LogRow{{Content: "hello"}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7, Rows: []*runnerv1.LogRow{{Content: "x"}}})); codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("log for another task: %v, want permission denied", err)
	}

	lease := dynrunnerv1connect.NewLeaseServiceClient(hc, srv.URL)
	ren, err := lease.Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(epoch)}))
	if err != nil || ren.Msg.GetEnded() {
		t.Fatalf("renew = %v, %v", ren, err)
	}
	// A holder of a stale epoch (an SVID of an earlier handover) is rejected.
	stale := e.client(workload.AssignmentID(e.td, 42, epoch-1))
	_, err = dynrunnerv1connect.NewLeaseServiceClient(stale, srv.URL).Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(epoch - 1)}))
	if codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stale renew: %v, want failed precondition (stale epoch)", err)
	}
	_, err = runnerClient(stale, srv.URL, r.GetUuid(), r.GetToken()).UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 42}}))
	if codeOf(err) != connect.CodeUnauthenticated && codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stale report: %v, want it rejected", err)
	}

	if _, err := rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_SUCCESS}})); err != nil {
		t.Fatal(err)
	}
	final, err := e.log.Get(ctx, 42)
	if err != nil {
		t.Fatal(err)
	}
	if final.Phase != assignment.Completed || final.Result != "success" || final.Epoch() != epoch {
		t.Fatalf("final state = %+v", final)
	}
	if e.forge.Result(42) != runnerv1.Result_RESULT_SUCCESS {
		t.Fatalf("upstream result = %v", e.forge.Result(42))
	}
	if got := e.forge.Log(42); len(got) != 1 || got[0] != "hello" {
		t.Fatalf("upstream log = %q", got)
	}
	ren, err = lease.Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(epoch)}))
	if err != nil || !ren.Msg.GetEnded() {
		t.Fatalf("renew after the end = %v, %v; want ended", ren, err)
	}

	// The attack: after the end, the environment (or the job inside it, which can read the
	// runner's credentials) reports again — a second final state with injected outputs, a late
	// log. Nothing is forwarded with the resident runner's credentials.
	_, err = rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{
		State:   &runnerv1.TaskState{Id: 42, Result: runnerv1.Result_RESULT_SUCCESS},
		Outputs: map[string]string{"injected": "by the job after its end"},
	}))
	if codeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "nothing more is forwarded") {
		t.Fatalf("a final report after the end: %v, want it refused", err)
	}
	_, err = rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Index: 1, Rows: []*runnerv1.LogRow{{Content: "late"}}}))
	if codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("a log after the end: %v, want it refused", err)
	}
	if n := e.forge.Reports(42); n != 1 {
		t.Fatalf("the forge got %d state reports for task 42, want the one final report", n)
	}
	if got := e.forge.Log(42); len(got) != 1 {
		t.Fatalf("upstream log after the end = %q", got)
	}
}

// TestFacadeRefusesForeignCA: a client whose SVID comes from another CA fails the handshake.
func TestFacadeRefusesForeignCA(t *testing.T) {
	e := newEnv(t)
	srv := e.facadeServer()
	st := e.claim(forgetest.Task(5))
	foreign, err := workload.LoadOrCreateDevCA(t.TempDir(), e.td)
	if err != nil {
		t.Fatal(err)
	}
	src, err := foreign.Source(workload.AssignmentID(e.td, 5, st.Epoch()), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The client trusts the real facade (its bundle) but presents a foreign SVID.
	cfg := workload.ClientTLSConfig(bundleOverride{src, e.ca}, workload.FacadeID(e.td))
	_, err = runnerClient(e.clientTLS(cfg), srv.URL, "", "").Register(t.Context(), connect.NewRequest(&runnerv1.RegisterRequest{Token: "x"}))
	if err == nil || codeOf(err) == connect.CodePermissionDenied {
		t.Fatalf("foreign SVID: %v, want a failed handshake", err)
	}
	// Without any client certificate the handshake fails too.
	_, err = runnerClient(&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}, srv.URL, "", "").Register(t.Context(), connect.NewRequest(&runnerv1.RegisterRequest{Token: "x"}))
	if err == nil {
		t.Fatal("a client without an SVID was served")
	}
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
	if codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("pod token on the guest listener: %v, want permission denied", err)
	}

	vm := e.claimOn(forgetest.Task(61), assignment.BackendVM)
	_, tok := e.start(vm)
	if _, err := runnerClient(hc, srv.URL, "", "").FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); codeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("guest fetch without credentials: %v, want unauthenticated", err)
	}
	reg, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "vm", Token: tok.Secret()}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "vm", Token: tok.Secret()})); codeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("replayed guest token: %v, want permission denied", err)
	}
	r := reg.Msg.GetRunner()
	rc := runnerClient(hc, srv.URL, r.GetUuid(), r.GetToken())
	got, err := rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if err != nil || got.Msg.GetTask().GetId() != 61 {
		t.Fatalf("guest fetch = %v, %v", got.Msg.GetTask(), err)
	}
	// A forged token naming another assignment fails the HMAC.
	forged := strings.Replace(r.GetToken(), "61.", "60.", 1)
	if _, err := runnerClient(hc, srv.URL, r.GetUuid(), forged).UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 60})); err == nil {
		t.Fatal("a forged runner token was served")
	}
	if _, err := rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 61, Result: runnerv1.Result_RESULT_SUCCESS}})); err != nil {
		t.Fatal(err)
	}
}

// TestFacadeRegisterBeforeStartedIsRetryable: an environment faster than its worker's
// `started` record is told to retry, not refused for good.
func TestFacadeRegisterBeforeStartedIsRetryable(t *testing.T) {
	e := newEnv(t)
	srv := e.facadeServer()
	st := e.claim(forgetest.Task(70))
	tok, err := e.issuer.Issue(st.Task, st.Epoch(), captoken.PurposeRegister)
	if err != nil {
		t.Fatal(err)
	}
	hc := e.client(workload.AssignmentID(e.td, 70, st.Epoch()))
	_, err = runnerClient(hc, srv.URL, "", "").Register(t.Context(), connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret()}))
	if codeOf(err) != connect.CodeUnavailable {
		t.Fatalf("register before started: %v, want unavailable (retry)", err)
	}
}
