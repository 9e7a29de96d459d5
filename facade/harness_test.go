package facade_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// env is one control plane under test: JetStream, a view, keys and a development CA.
type env struct {
	t      *testing.T
	log    *eventlog.Log
	view   *eventlog.View
	box    *sealbox.Box
	issuer *captoken.Issuer
	ca     *workload.DevCA
	td     spiffeid.TrustDomain
	forge  *forgetest.Forge
	// limits and logw configure the facade servers serve starts (zero: the defaults, the
	// test's log).
	limits facade.ServerLimits
	logw   io.Writer
	// now is the facades' clock (zero: time.Now).
	now func() time.Time
	// metrics count what the facades serve and refuse.
	metrics *facade.Metrics
}

// runnerKey derives the runner tokens of the facades serve starts.
var runnerKey = []byte("runner-key-runner-key-runner-key")

func newEnv(t *testing.T) *env {
	t.Helper()
	l, v := eventlogtest.Open(t)
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	issuer, err := captoken.NewIssuer([]byte("fedcba9876543210fedcba9876543210"))
	require.NoError(t, err)
	td := spiffeid.RequireTrustDomainFromString("test.dynrunner")
	ca, err := workload.LoadOrCreateDevCA(t.TempDir(), td)
	require.NoError(t, err)
	return &env{t: t, log: l, view: v, box: box, issuer: issuer, ca: ca, td: td, forge: forgetest.New(), metrics: facade.NewMetrics(nil)}
}

// server is a facade listening for mTLS on loopback.
type server struct{ URL string }

func (e *env) facadeServer() server { return e.serve(false) }

// guestServer is the facade's listener for microVM guests: server-authenticated TLS only.
func (e *env) guestServer() server { return e.serve(true) }

func (e *env) serve(guest bool) server {
	e.t.Helper()
	logw := e.logw
	if logw == nil {
		logw = zerolog.NewTestWriter(e.t)
	}
	f := facade.New(facade.Config{
		Actor: "facade-test", TrustDomain: e.td, Lease: 5 * time.Minute, Issuer: e.issuer,
		RunnerKey: runnerKey, Box: e.box, Log: zerolog.New(logw), Limits: e.limits, Now: e.now, Metrics: e.metrics,
	}, e.forge, e.log, e.view)
	src, err := e.ca.ServerSource(workload.FacadeID(e.td), time.Hour, workload.LocalHosts())
	require.NoError(e.t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(e.t, err)
	hs := f.Server(f.Handler(), workload.ServerTLSConfig(src))
	if guest {
		hs = f.Server(f.GuestHandler(), workload.GuestServerTLSConfig(src))
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.ServeTLS(ln, "", "") }()
	e.t.Cleanup(func() { _ = hs.Close(); <-done })
	return server{URL: "https://" + ln.Addr().String()}
}

// client returns an HTTP client presenting an SVID for id, trusting the facade.
func (e *env) client(id spiffeid.ID) *http.Client {
	e.t.Helper()
	src, err := e.ca.Source(id, time.Hour)
	require.NoError(e.t, err)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: workload.ClientTLSConfig(src, workload.FacadeID(e.td)), ForceAttemptHTTP2: true}}
}

func (e *env) clientTLS(cfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
}

// claim persists a task's assignment as the scheduler does and returns its state.
func (e *env) claim(task *runnerv1.Task) assignment.State {
	return e.claimOn(task, assignment.BackendPod)
}

func (e *env) claimOn(task *runnerv1.Task, backend assignment.Backend) assignment.State {
	e.t.Helper()
	ctx := e.t.Context()
	id := assignment.TaskID(task.GetId())
	sealed, digest, err := sealedtask.Seal(e.box, id, task)
	require.NoError(e.t, err)
	require.NoError(e.t, e.log.PutTask(ctx, id, sealed))
	st, err := e.log.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: id, At: time.Now(), Actor: "test",
		Backend: backend, TaskDigest: digest, Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(e.t, err)
	return st
}

// start records the environment's start with a fresh capability token, as the worker does.
func (e *env) start(st assignment.State) (assignment.State, captoken.Token) {
	e.t.Helper()
	tok, err := e.issuer.Issue(st.Task, st.Epoch(), captoken.PurposeRegister, st.PickupDeadline)
	require.NoError(e.t, err)
	next, err := e.log.Apply(e.t.Context(), assignment.Event{Transition: assignment.Started, Task: st.Task, Epoch: st.Epoch(),
		At: time.Now(), Actor: "test", Handle: []byte(`{"id":"test"}`), TokenID: tok.ID()}, nil)
	require.NoError(e.t, err)
	return next, tok
}
