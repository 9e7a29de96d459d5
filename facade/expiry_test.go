package facade_test

import (
	"sync"
	"testing"
	"time"

	pingv1 "code.gitea.io/actions-proto-go/ping/v1"
	"code.gitea.io/actions-proto-go/ping/v1/pingv1connect"
	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/forgetest"
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
	c := &clock{now: st.LeaseExpires.Add(time.Minute)} // the facade starts after the lease ended
	e.now = c.Now
	srv := e.facadeServer()
	hc := e.client(workload.AssignmentID(e.td, 42, st.Epoch()))
	ctx := t.Context()
	_, err := runnerClient(hc, srv.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "env", Token: tok.Secret(), Ephemeral: true}))
	require.NoError(t, err)
	_, err = dynrunnerv1connect.NewLeaseServiceClient(hc, srv.URL).Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: 42, Epoch: uint64(st.Epoch())}))
	require.NoError(t, err)
}
