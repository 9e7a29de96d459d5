package executor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/facade"
)

// facadeStub is one facade of a failover test: it answers with its name and counts requests,
// until it is killed (every request then aborts its connection, as a facade process killed
// mid-request does).
type facadeStub struct {
	name string
	h    http.Handler // nil: answer the name
	dead atomic.Bool
	hits atomic.Int64
	srv  *httptest.Server
}

func (s *facadeStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.dead.Load() {
		panic(http.ErrAbortHandler)
	}
	s.hits.Add(1)
	if s.h != nil {
		s.h.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	_, _ = io.WriteString(w, s.name+" "+string(body))
}

func startStub(t *testing.T, name string, h http.Handler) *facadeStub {
	t.Helper()
	if h != nil {
		// The runner API, below the path the clients name.
		h = http.StripPrefix("/api/actions", h)
	}
	s := &facadeStub{name: name, h: h}
	s.srv = httptest.NewUnstartedServer(s)
	s.srv.EnableHTTP2 = true
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	return s
}

// refusing is the URL of a server that is gone: connections to it are refused.
func refusing(t *testing.T) string {
	t.Helper()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	u := srv.URL
	srv.Close()
	return u
}

// fakeClock is the failover's clock: Sleep only records the pause and moves Now on.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	slept  []time.Duration
	paused func() // run at every pause (nil: nothing)
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.slept = append(c.slept, d)
	paused := c.paused
	c.mu.Unlock()
	if paused != nil {
		paused()
	}
	return ctx.Err()
}

func newTestFailover(t *testing.T, clock *fakeClock, stubs []*facadeStub, urls ...string) *Failover {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool()}, ForceAttemptHTTP2: true}
	for _, s := range stubs {
		tr.TLSClientConfig.RootCAs.AddCert(s.srv.Certificate())
	}
	t.Cleanup(tr.CloseIdleConnections)
	f, err := NewFailover(FailoverConfig{
		Facades: urls, Next: tr, Now: clock.Now, Sleep: clock.Sleep, Log: zerolog.New(zerolog.NewTestWriter(t)),
		Resolve: func(context.Context, string) ([]string, error) { return nil, errors.New("no resolver in tests") },
	})
	require.NoError(t, err)
	return f
}

// post sends body through rt and returns the answer's status code and body.
func post(t *testing.T, rt http.RoundTripper, u, body string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, u+"/api/actions/runner.v1.RunnerService/UpdateLog", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(data), nil
}

func TestFailoverMovesOnFromAConnectionFailureAndStays(t *testing.T) {
	for _, tc := range []struct {
		name string
		gone func(t *testing.T, first *facadeStub) string // the first facade's URL, made to fail
	}{
		{"refused", func(t *testing.T, _ *facadeStub) string { return refusing(t) }},
		{"killed mid-request", func(_ *testing.T, first *facadeStub) string { first.dead.Store(true); return first.srv.URL }},
		{"gateway 503", func(_ *testing.T, first *facadeStub) string {
			first.h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
			})
			return first.srv.URL
		}},
		{"gateway 502", func(_ *testing.T, first *facadeStub) string {
			first.h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) })
			return first.srv.URL
		}},
		{"tls handshake", func(t *testing.T, _ *facadeStub) string {
			// A server whose certificate the failover's transport does not trust.
			cert, err := selfSigned("127.0.0.1")
			require.NoError(t, err)
			srv := httptest.NewUnstartedServer(http.NotFoundHandler())
			srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
			srv.StartTLS()
			t.Cleanup(srv.Close)
			return srv.URL
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, second := startStub(t, "first", nil), startStub(t, "second", nil)
			clock := &fakeClock{now: time.Unix(0, 0)}
			firstURL := tc.gone(t, first)
			f := newTestFailover(t, clock, []*facadeStub{first, second}, firstURL, second.srv.URL)

			code, body, err := post(t, f, firstURL, "rows 0-9")
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, "second rows 0-9", body, "the body is sent again, whole")
			assert.Equal(t, second.srv.URL, f.Current())
			assert.Equal(t, []time.Duration{DefaultFailoverBackoff}, clock.slept)

			// Sticky: the next requests go to the second facade at once.
			firstHits := first.hits.Load()
			for i := range 3 {
				_, body, err := post(t, f, firstURL, fmt.Sprint(i))
				require.NoError(t, err)
				assert.Equal(t, fmt.Sprintf("second %d", i), body)
			}
			assert.Equal(t, firstHits, first.hits.Load())
			assert.Len(t, clock.slept, 1)
		})
	}
}

func TestFailoverPassesTheFacadesOwnAnswersOn(t *testing.T) {
	for _, tc := range []struct {
		name string
		code connect.Code
	}{
		{"permission denied", connect.CodePermissionDenied},
		{"unauthenticated", connect.CodeUnauthenticated},
		{"failed precondition", connect.CodeFailedPrecondition},
		// The facade's own Unavailable (the forge is down, the environment's start is not
		// recorded yet) asks the caller to retry; another facade would answer the same.
		{"unavailable", connect.CodeUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, handler := runnerv1connect.NewRunnerServiceHandler(refusingRunnerService{code: tc.code})
			first, second := startStub(t, "first", handler), startStub(t, "second", nil)
			clock := &fakeClock{now: time.Unix(0, 0)}
			f := newTestFailover(t, clock, []*facadeStub{first, second}, first.srv.URL, second.srv.URL)
			client := runnerv1connect.NewRunnerServiceClient(&http.Client{Transport: f}, first.srv.URL+"/api/actions")
			_, err := client.UpdateLog(t.Context(), connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 1}))
			require.Error(t, err)
			assert.Equal(t, tc.code, connect.CodeOf(err))
			assert.Equal(t, int64(0), second.hits.Load(), "no failover on the facade's own answer")
			assert.Equal(t, first.srv.URL, f.Current())
			assert.Empty(t, clock.slept)
		})
	}
}

type refusingRunnerService struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	code connect.Code
}

func (s refusingRunnerService) UpdateLog(context.Context, *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	return nil, connect.NewError(s.code, errors.New("refused"))
}

func TestFailoverGivesUpAfterItsBudget(t *testing.T) {
	a, b := refusing(t), refusing(t)
	clock := &fakeClock{now: time.Unix(0, 0)}
	f := newTestFailover(t, clock, nil, a, b)
	_, _, err := post(t, f, a, "x")
	require.ErrorIs(t, err, ErrNoFacade)
	assert.Contains(t, err.Error(), a)
	assert.Contains(t, err.Error(), b)
	assert.Contains(t, err.Error(), "refused")
	// 250 ms doubling to 8 s, and no pause that would end beyond the budget.
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}
	var total time.Duration
	for _, d := range want {
		total += d
	}
	for total+8*time.Second <= DefaultFailoverBudget {
		want = append(want, 8*time.Second)
		total += 8 * time.Second
	}
	assert.Equal(t, want, clock.slept)
}

func TestFailoverComesBackToAFacadeThatReturns(t *testing.T) {
	first, second := startStub(t, "first", nil), startStub(t, "second", nil)
	clock := &fakeClock{now: time.Unix(0, 0)}
	f := newTestFailover(t, clock, []*facadeStub{first, second}, first.srv.URL, second.srv.URL)
	first.dead.Store(true)
	second.dead.Store(true)
	// Both are down; the first comes back after a few pauses.
	clock.paused = func() {
		if len(clock.slept) == 2 {
			first.dead.Store(false)
		}
	}
	_, body, err := post(t, f, first.srv.URL, "x")
	require.NoError(t, err)
	assert.Equal(t, "first x", body)
	assert.Len(t, clock.slept, 2)
}

func TestFailoverStopsWithTheRequestsContext(t *testing.T) {
	clock := &fakeClock{now: time.Unix(0, 0)}
	a := refusing(t)
	f := newTestFailover(t, clock, nil, a, refusing(t))
	ctx, cancel := context.WithCancel(t.Context())
	clock.paused = cancel
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a+"/x", strings.NewReader("x"))
	require.NoError(t, err)
	resp, err := f.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, context.Canceled)
	assert.Len(t, clock.slept, 1)
}

// logStore is the forge's log of one task, as Gitea keeps it: rows are indexed, a batch
// starting beyond what the forge has is refused, and rows it has already are skipped.
type logStore struct {
	mu   sync.Mutex
	rows []string
}

func (s *logStore) UpdateLog(_ context.Context, req *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ack := int64(len(s.rows))
	rows := req.Msg.GetRows()
	if idx := req.Msg.GetIndex(); idx <= ack && idx+int64(len(rows)) > ack {
		for _, r := range rows[ack-idx:] {
			s.rows = append(s.rows, r.GetContent())
		}
	}
	return connect.NewResponse(&runnerv1.UpdateLogResponse{AckIndex: int64(len(s.rows))}), nil
}

// forwarder is a facade: it forwards UpdateLog to the forge's log. killAfter, when set, is
// called after each forwarded batch; when it says so, the facade dies before it answers.
type forwarder struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	forge *logStore
	stub  *facadeStub
	kill  func(index int64) bool
}

func (f *forwarder) UpdateLog(ctx context.Context, req *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	resp, err := f.forge.UpdateLog(ctx, req)
	if f.kill != nil && f.kill(req.Msg.GetIndex()) {
		f.stub.dead.Store(true)
		panic(http.ErrAbortHandler)
	}
	return resp, err
}

// TestFailoverKeepsTheLogCompleteAndInOrder sends a job's log in batches, as the runner does,
// through two facades; the first dies after forwarding a batch but before answering it. The
// batch is sent again to the second facade, and the forge's log has every line once, in order.
func TestFailoverKeepsTheLogCompleteAndInOrder(t *testing.T) {
	forge := &logStore{}
	var stubs []*facadeStub
	for i, name := range []string{"first", "second"} {
		fw := &forwarder{forge: forge}
		if i == 0 {
			fw.kill = func(index int64) bool { return index == 30 }
		}
		_, h := runnerv1connect.NewRunnerServiceHandler(fw)
		fw.stub = startStub(t, name, h)
		stubs = append(stubs, fw.stub)
	}
	clock := &fakeClock{now: time.Unix(0, 0)}
	f := newTestFailover(t, clock, stubs, stubs[0].srv.URL, stubs[1].srv.URL)
	client := runnerv1connect.NewRunnerServiceClient(&http.Client{Transport: f}, stubs[0].srv.URL+"/api/actions")

	var want []string
	for i := range 100 {
		want = append(want, fmt.Sprintf("line %d", i))
	}
	var ack int64
	for ack < int64(len(want)) {
		var rows []*runnerv1.LogRow
		for _, l := range want[ack:min(ack+10, int64(len(want)))] {
			rows = append(rows, &runnerv1.LogRow{Content: l})
		}
		resp, err := client.UpdateLog(t.Context(), connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 1, Index: ack, Rows: rows}))
		require.NoError(t, err)
		require.Greater(t, resp.Msg.GetAckIndex(), ack)
		ack = resp.Msg.GetAckIndex()
	}
	assert.Equal(t, want, forge.rows)
	assert.True(t, stubs[0].dead.Load(), "the first facade died")
	assert.Equal(t, stubs[1].srv.URL, f.Current())
}

func TestRegisterKeyHeaderIsTheFacades(t *testing.T) {
	assert.Equal(t, facade.RegisterKeyHeader, registerKeyHeader)
}
