package facade_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pingv1 "code.gitea.io/actions-proto-go/ping/v1"
	"code.gitea.io/actions-proto-go/ping/v1/pingv1connect"
	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/workload"
	dynrunnerv1 "github.com/dynrunner/dynrunner/proto/dynrunner/v1"
	"github.com/dynrunner/dynrunner/proto/dynrunner/v1/dynrunnerv1connect"
)

// clock is the facade's clock in a test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// set moves the clock to t.
func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// TestFacadeCredentialsEndWithTheLease: the runner credentials an environment got at Register
// work while its lease runs, again after every renewal, and not once it has ended; an SVID that
// expired is refused on a connection opened while it was valid.
func TestFacadeCredentialsEndWithTheLease(t *testing.T) {
	e := newEnv(t)
	c := &clock{now: time.Now()}
	e.now = c.Now
	srv := e.facadeServer()
	ctx := t.Context()

	st := e.claim(forgetest.Task(42))
	_, tok := e.start(st)
	hc := e.client(workload.AssignmentID(e.td, 42, st.Epoch())) // an SVID valid for an hour
	reg, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true}))
	require.NoError(t, err)
	rc := runnerClient(hc, srv.URL, reg.Msg.GetRunner().GetUuid(), reg.Msg.GetRunner().GetToken())
	_, err = rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.NoError(t, err)
	logRow := func() error {
		_, err := rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Rows: []*runnerv1.LogRow{{Content: "x"}}}))
		return err
	}
	require.NoError(t, logRow())
	cur, err := e.log.Get(ctx, 42)
	require.NoError(t, err)

	// Renewed: the credentials live on with the lease.
	lease := dynrunnerv1connect.NewLeaseServiceClient(hc, srv.URL)
	c.set(cur.LeaseExpires.Add(-time.Minute))
	ren, err := lease.Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(st.Epoch())}))
	require.NoError(t, err)
	renewed := ren.Msg.GetLeaseExpiresAt().AsTime()
	require.True(t, renewed.After(cur.LeaseExpires))
	c.set(cur.LeaseExpires.Add(time.Second))
	require.NoError(t, logRow(), "refused after a renewal moved the lease on")

	// Ended: refused, and the lease cannot be renewed any more.
	c.set(renewed.Add(time.Second))
	assert.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(logRow()), "runner credentials outlived the lease")
	_, err = lease.Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(st.Epoch())}))
	assert.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "an ended lease was renewed")

	// The SVID has expired: the open connection speaks for nobody.
	c.set(time.Now().Add(2 * time.Hour))
	_, err = pingv1connect.NewPingServiceClient(hc, srv.URL+"/api/actions").Ping(ctx, connect.NewRequest(&pingv1.PingRequest{Data: "x"}))
	assert.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err), "an expired SVID was accepted")
}

// TestFacadeRenewsAfterItsOwnRestart: a lease that ran out while no facade was up can still be
// renewed by an environment that reaches a facade within the restart grace.
func TestFacadeRenewsAfterItsOwnRestart(t *testing.T) {
	e := newEnv(t)
	st := e.claim(forgetest.Task(42))
	_, tok := e.start(st)
	c := &clock{now: time.Now()}
	e.now = c.Now
	hc := e.client(workload.AssignmentID(e.td, 42, st.Epoch()))
	ctx := t.Context()
	_, err := runnerClient(hc, e.facadeServer().URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true}))
	require.NoError(t, err)
	c.set(st.LeaseExpires.Add(time.Minute)) // the next facade starts after the lease ended
	srv := e.facadeServer()
	_, err = dynrunnerv1connect.NewLeaseServiceClient(hc, srv.URL).Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(st.Epoch())}))
	require.NoError(t, err)
}

// TestFacadeRefusesExpiredRegistrationTokens: a capability token expires with its
// assignment's pickup deadline. Up to it the environment registers; after it, a first
// redemption is refused (token_expired, Unauthenticated) with an error naming the deadline,
// and nothing is recorded. The environment's own Register sent again to another facade after
// the deadline (failover of a registered environment) is still answered.
func TestFacadeRefusesExpiredRegistrationTokens(t *testing.T) {
	e := newEnv(t)
	c := &clock{now: time.Now()}
	e.now = c.Now
	srv := e.facadeServer()
	ctx := t.Context()
	expired := func() float64 { return testutil.ToFloat64(e.metrics.Refused.WithLabelValues("token_expired")) }
	register := func(url string, st assignment.State, tok captoken.Token, key string) (*connect.Response[runnerv1.RegisterResponse], error) {
		req := connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true})
		if key != "" {
			req.Header().Set(facade.RegisterKeyHeader, key)
		}
		return runnerClient(e.client(workload.AssignmentID(e.td, st.Task, st.Epoch())), url, "", "").Register(ctx, req)
	}

	// Past the deadline: refused, and the token is not redeemed.
	late := e.claim(forgetest.Task(12))
	late, lateTok := e.start(late)
	require.Equal(t, late.PickupDeadline.Truncate(time.Second).UTC(), lateTok.Expires(), "the token's expiry")
	c.set(lateTok.Expires().Add(time.Second))
	_, err := register(srv.URL, late, lateTok, strings.Repeat("ab", 32))
	require.Equal(t, connect.CodeUnauthenticated, codeOf(err), "an expired token: %v", err)
	want := fmt.Sprintf("dynrunner facade: registration token of task 12 epoch %d expired at %s: the assignment's pickup deadline "+
		"(PICKUP_SECS, counted from its claim) passed before the environment registered",
		late.Epoch(), lateTok.Expires().Format(time.RFC3339))
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, want, ce.Message(), "the refusal")
	assert.Equal(t, 1.0, expired(), "refusals counted as token_expired")
	cur, err := e.log.Get(ctx, 12)
	require.NoError(t, err)
	assert.Equal(t, assignment.Started, cur.Phase, "an expired token was redeemed")
	assert.Empty(t, cur.RunnerUUID, "an expired token was redeemed")

	// At the deadline: registers; after it, the same environment's Register again is answered
	// by another facade, and anyone else holding the token is still refused.
	onTime := e.claim(forgetest.Task(13))
	onTime, tok := e.start(onTime)
	c.set(tok.Expires())
	key := strings.Repeat("cd", 32)
	reg, err := register(srv.URL, onTime, tok, key)
	require.NoError(t, err, "a token at its expiry")
	c.set(tok.Expires().Add(time.Minute))
	again, err := register(e.facadeServer().URL, onTime, tok, key)
	require.NoError(t, err, "the registered environment's Register again after the deadline")
	assert.Equal(t, reg.Msg.GetRunner().GetUuid(), again.Msg.GetRunner().GetUuid(), "runner answered again")
	_, err = register(srv.URL, onTime, tok, strings.Repeat("ef", 32))
	require.Error(t, err, "another key with the expired token")
	assert.Equal(t, 2.0, expired(), "refusals counted as token_expired")
}

// TestFacadeRereadsALeaseItsViewSaysIsOver: a facade whose view is behind a renewal made
// through another facade (it was cut off from NATS while the environment failed over) reads
// the assignment again before it refuses the lease as over: the renewal and the reports go on.
func TestFacadeRereadsALeaseItsViewSaysIsOver(t *testing.T) {
	e := newEnv(t)
	c := &clock{now: time.Now()}
	e.now = c.Now
	srv := e.facadeServer()
	ctx := t.Context()

	st := e.claim(forgetest.Task(42))
	_, tok := e.start(st)
	hc := e.client(workload.AssignmentID(e.td, 42, st.Epoch()))
	reg, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true}))
	require.NoError(t, err)
	uuid, token := reg.Msg.GetRunner().GetUuid(), reg.Msg.GetRunner().GetToken()
	_, err = runnerClient(hc, srv.URL, uuid, token).FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.NoError(t, err)
	running, err := e.log.Get(ctx, 42)
	require.NoError(t, err)
	require.Equal(t, assignment.Running, running.Phase)

	// The other facade's view stops at the fetch.
	stale := eventlog.NewView()
	stale.Observe(running)
	e.view = stale
	behind := e.facadeServer()

	c.set(running.LeaseExpires.Add(-time.Minute))
	_, err = dynrunnerv1connect.NewLeaseServiceClient(hc, srv.URL).Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(st.Epoch())}))
	require.NoError(t, err)

	// Past the lease the stale view knows, within the renewed one.
	c.set(running.LeaseExpires.Add(time.Second))
	ren, err := dynrunnerv1connect.NewLeaseServiceClient(hc, behind.URL).Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(st.Epoch())}))
	require.NoError(t, err, "a renewed lease refused on a stale view")
	require.False(t, ren.Msg.GetEnded())
	_, err = runnerClient(hc, behind.URL, uuid, token).UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 42, Rows: []*runnerv1.LogRow{{Content: "x"}}}))
	require.NoError(t, err, "the runner credentials of a renewed lease refused on a stale view")
}

// TestFacadeDeclaresWhileTheAssignmentCannotBeRead: the Gitea runner declares once and exits
// when that fails; a facade that cannot read the assignment (JetStream failing over) answers a
// Declare with valid runner credentials all the same, refuses forged ones, and hands out no
// task until it can read the assignment.
func TestFacadeDeclaresWhileTheAssignmentCannotBeRead(t *testing.T) {
	e := newEnv(t)
	l, v, js := eventlogtest.OpenJetStream(t)
	e.log, e.view = l, v
	srv := e.facadeServer()
	ctx := t.Context()

	st := e.claim(forgetest.Task(42))
	_, tok := e.start(st)
	hc := e.client(workload.AssignmentID(e.td, 42, st.Epoch()))
	reg, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true}))
	require.NoError(t, err)
	uuid, token := reg.Msg.GetRunner().GetUuid(), reg.Msg.GetRunner().GetToken()

	// Another facade, whose view has not seen the registration, and JetStream cannot be read.
	e.view = eventlog.NewView()
	behind := e.facadeServer()
	require.NoError(t, js.DeleteStream(ctx, eventlog.StreamAssignments))

	got, err := runnerClient(hc, behind.URL, uuid, token).Declare(ctx, connect.NewRequest(&runnerv1.DeclareRequest{Labels: []string{"pod"}}))
	require.NoError(t, err, "a runner's Declare failed on an unreadable assignment: the runner would exit")
	require.Equal(t, uuid, got.Msg.GetRunner().GetUuid())
	_, err = runnerClient(hc, behind.URL, uuid, "forged").Declare(ctx, connect.NewRequest(&runnerv1.DeclareRequest{Labels: []string{"pod"}}))
	require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err), "forged runner credentials declared")
	_, err = runnerClient(hc, behind.URL, uuid, token).FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err), "a task handed out on an unreadable assignment")
}
