package facade_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	pingv1 "code.gitea.io/actions-proto-go/ping/v1"
	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// allocatedDuring reports how many bytes this process allocated while fn ran: the facade
// runs in the test's process, so a body it inflated or read whole shows here.
func allocatedDuring(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// ping posts body to the facade's PingService as a Connect unary call.
func ping(t *testing.T, hc *http.Client, url string, body io.Reader, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/api/actions/ping.v1.PingService/Ping", body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/proto")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestFacadeBoundsMessages plays a job holding its environment's SVID against the facade: a
// 256 KB gzip body that inflates to 256 MiB, and a 100 MB plain Ping. Both are refused, and the
// facade never holds more than its limit of them.
func TestFacadeBoundsMessages(t *testing.T) {
	e := newEnv(t)
	srv := e.facadeServer()
	hc := e.client(workload.AssignmentID(e.td, 7, 3))

	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	zeros := make([]byte, 1<<20)
	for range 256 {
		_, _ = zw.Write(zeros)
	}
	require.NoError(t, zw.Close())
	require.Less(t, bomb.Len(), 1<<20, "the bomb is small on the wire")

	var code int
	var body string
	n := allocatedDuring(func() {
		code, body = ping(t, hc, srv.URL, bytes.NewReader(bomb.Bytes()), map[string]string{"Content-Encoding": "gzip"})
	})
	assert.Equal(t, http.StatusTooManyRequests, code, "Connect's resource_exhausted: %s", body)
	assert.Contains(t, body, "larger than configured max")
	assert.Less(t, n, uint64(6*allocSlack*facade.DefaultMaxMessageBytes), "the facade allocated %d MiB for a gzip bomb", n>>20)

	big, err := proto.Marshal(&pingv1.PingRequest{Data: strings.Repeat("x", 100<<20)})
	require.NoError(t, err)
	n = allocatedDuring(func() { code, body = ping(t, hc, srv.URL, bytes.NewReader(big), nil) })
	assert.NotEqual(t, http.StatusOK, code, "a 100 MB ping was answered: %.200s", body)
	assert.NotContains(t, body, "xxxxxxxx", "the body was echoed")
	assert.Less(t, n, uint64(6*allocSlack*facade.DefaultMaxMessageBytes), "the facade allocated %d MiB for a 100 MB body", n>>20)

	// An ordinary ping still works.
	small, _ := proto.Marshal(&pingv1.PingRequest{Data: "hi"})
	code, _ = ping(t, hc, srv.URL, bytes.NewReader(small), nil)
	assert.Equal(t, http.StatusOK, code)
}

// trickle opens a request with a declared body and sends it one byte per interval; the channel
// receives the time the server answered (or dropped the connection) and its status line.
func trickle(t *testing.T, cfg *tls.Config, addr string, every time.Duration) (<-chan answer, func()) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	require.NoError(t, err)
	stop := make(chan struct{})
	closed := make(chan answer, 1)
	_, err = fmt.Fprintf(conn, "POST /api/actions/ping.v1.PingService/Ping HTTP/1.1\r\nHost: facade\r\nContent-Type: application/proto\r\nContent-Length: 100000\r\n\r\n")
	require.NoError(t, err)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if _, err := conn.Write([]byte{0}); err != nil {
					return
				}
			}
		}
	}()
	go func() {
		line, _ := bufio.NewReader(conn).ReadString('\n')
		closed <- answer{time.Now(), strings.TrimSpace(line)}
	}()
	var once sync.Once
	return closed, func() { once.Do(func() { close(stop); conn.Close() }) }
}

type answer struct {
	at     time.Time
	status string
}

// TestFacadeCutsOffSlowBodies: a caller trickling its body is cut off after ReadTimeout; and
// one identity holds at most PerIdentity requests in flight, while another is still served.
func TestFacadeCutsOffSlowBodies(t *testing.T) {
	e := newEnv(t)
	e.limits = facade.ServerLimits{ReadTimeout: time.Second, PerIdentity: 2}
	srv := e.facadeServer()
	addr := strings.TrimPrefix(srv.URL, "https://")
	me := workload.AssignmentID(e.td, 7, 3)
	tlsFor := func(hc *http.Client) *tls.Config { return hc.Transport.(*http.Transport).TLSClientConfig }

	began := time.Now()
	closed, stop := trickle(t, tlsFor(e.client(me)), addr, 100*time.Millisecond)
	defer stop()
	select {
	case a := <-closed:
		assert.Less(t, a.at.Sub(began), 5*time.Second)
		assert.Equal(t, "HTTP/1.1 504 Gateway Timeout", a.status, "Connect's deadline_exceeded")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "a trickled body held its request open for 10 s; ReadTimeout is 1 s")
	}

	// In flight: two slow requests of one identity; the third is refused, another identity's
	// request served.
	e.limits.ReadTimeout = 30 * time.Second
	srv = e.facadeServer()
	addr = strings.TrimPrefix(srv.URL, "https://")
	for range 2 {
		_, stop := trickle(t, tlsFor(e.client(me)), addr, 100*time.Millisecond)
		defer stop()
	}
	small, _ := proto.Marshal(&pingv1.PingRequest{Data: "hi"})
	deadline := time.Now().Add(5 * time.Second)
	var code int
	for {
		code, _ = ping(t, e.client(me), srv.URL, bytes.NewReader(small), nil)
		if code == http.StatusTooManyRequests || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	assert.Equal(t, http.StatusTooManyRequests, code, "a third request in flight from one identity")
	code, _ = ping(t, e.client(workload.AssignmentID(e.td, 8, 4)), srv.URL, bytes.NewReader(small), nil)
	assert.Equal(t, http.StatusOK, code, "another identity is served")
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestFacadeLogsRefusedHandshakesStructured: refused handshakes are logged as JSON, one line
// per interval however many arrive, the rest counted.
func TestFacadeLogsRefusedHandshakesStructured(t *testing.T) {
	e := newEnv(t)
	var logs syncBuffer
	e.logw = &logs
	e.limits = facade.ServerLimits{HandshakeLogEvery: time.Hour}
	srv := e.facadeServer()
	addr := strings.TrimPrefix(srv.URL, "https://")
	for range 20 {
		// No client certificate: the facade requires one.
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			_, _ = c.Read(make([]byte, 1))
			c.Close()
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "facade refused a TLS handshake") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, "TLS handshake") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 1, "one line for 20 refused handshakes within the interval:\n%s", logs.String())
	assert.True(t, strings.HasPrefix(lines[0], "{") && strings.Contains(lines[0], `"remote":"127.0.0.1:`), "structured: %s", lines[0])
	assert.NotContains(t, logs.String(), "http: TLS handshake error", "no plain-text line")
}

// TestFacadeLogsRefusedRequestsBounded: a caller sending request after request the facade
// refuses (a wrong runner token) gets one log line per interval, however many it sends; the
// metric counts them all.
func TestFacadeLogsRefusedRequestsBounded(t *testing.T) {
	e := newEnv(t)
	var logs syncBuffer
	e.logw = &logs
	e.limits = facade.ServerLimits{HandshakeLogEvery: time.Hour}
	srv := e.facadeServer()
	st := e.claim(forgetest.Task(42))
	hc := e.client(workload.AssignmentID(e.td, 42, st.Epoch()))
	for range 50 {
		_, err := runnerClient(hc, srv.URL, "some-uuid", "wrong").FetchTask(t.Context(), connect.NewRequest(&runnerv1.FetchTaskRequest{}))
		require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err))
	}
	n := strings.Count(logs.String(), `"reason":"bad_runner_token"`)
	assert.Equal(t, 1, n, "50 refused requests within the interval:\n%s", logs.String())
}
