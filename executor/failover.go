package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/clock"
)

// The failover's defaults: the pause after a failed attempt starts at DefaultFailoverBackoff
// and doubles up to DefaultFailoverMaxBackoff; a request gives up DefaultFailoverBudget after
// its first failure.
const (
	DefaultFailoverBackoff    = 250 * time.Millisecond
	DefaultFailoverMaxBackoff = 8 * time.Second
	DefaultFailoverBudget     = 90 * time.Second
)

// maxReplayBytes is the largest request body the failover keeps to send again: the facade's
// own limit on a request (facade.DefaultMaxMessageBytes and its slack). A larger body is sent
// once, to the current facade, without failover; the facade refuses it anyway.
const maxReplayBytes = 8<<20 + 64<<10

// ErrNoFacade: no facade of the list answered a request within the failover's budget. The
// error that wraps it names every facade tried and why each failed.
var ErrNoFacade = errors.New("executor: no facade reachable")

// FailoverConfig configures NewFailover.
type FailoverConfig struct {
	// Facades are the facades' URLs (ParseFacadeURLs), tried in this order.
	Facades []string
	// Next sends one attempt: the transport that dials the facades (mTLS).
	Next http.RoundTripper
	// Resolve returns the addresses of a host name; a name with several is tried address by
	// address, as facades of their own. Nil: the system resolver.
	Resolve func(ctx context.Context, host string) ([]string, error)
	// Backoff, MaxBackoff and Budget: zero means the defaults.
	Backoff, MaxBackoff, Budget time.Duration
	// Now and Sleep are the clock; nil means the real one.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
	Log   zerolog.Logger
}

// Failover is the executor's transport to the facades. The facade keeps no state of its own
// (everything is in JetStream), so any live facade serves any environment: Failover sends
// every request to the current facade, whatever host the request names, and stays with it
// (sticky) until a connection-level failure moves it to the next one of the list. A
// connection-level failure is a transport error (dial refused, reset, EOF, TLS handshake
// failure, timeout) or an HTTP 502, 503 or 504 that is not the facade's own answer (a connect
// error, JSON): a gateway before a facade that is gone. An answer of the facade itself, an
// application error such as permission denied, is returned as it is.
//
// The request is sent again, after a pause of Backoff doubling up to MaxBackoff, until one
// facade answers or Budget has passed since the first failure; then it fails with ErrNoFacade.
// Sending again is safe because every call of the runner API is idempotent at the facade: log
// rows are indexed (a repeated UpdateLog adds nothing), a repeated FetchTask hands the same
// task to the same runner, a repeated Register or final UpdateTask of the same environment is
// answered as the first was (docs/architecture.md, "Facade failover").
type Failover struct {
	cfg FailoverConfig

	mu        sync.Mutex
	endpoints []endpoint // the facades, names with several addresses expanded
	resolved  bool
	cur       int
}

// endpoint is one facade address a request can be sent to.
type endpoint struct {
	facade string // the facade URL of the list it comes from
	host   string // host:port to send to
}

func (e endpoint) String() string {
	if strings.HasSuffix(e.facade, "//"+e.host) {
		return e.facade
	}
	return e.facade + " (" + e.host + ")"
}

var _ http.RoundTripper = (*Failover)(nil)

// NewFailover returns the failover transport over cfg.Facades; it fails when the list is
// empty.
func NewFailover(cfg FailoverConfig) (*Failover, error) {
	if len(cfg.Facades) == 0 {
		return nil, fmt.Errorf("%w: no facade to fail over between", ErrFacadeURL)
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultFailoverBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultFailoverMaxBackoff
	}
	if cfg.Budget <= 0 {
		cfg.Budget = DefaultFailoverBudget
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = clock.Sleep
	}
	if cfg.Resolve == nil {
		cfg.Resolve = net.DefaultResolver.LookupHost
	}
	f := &Failover{cfg: cfg}
	for _, raw := range cfg.Facades {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("%w: %q: want https://host:port", ErrFacadeURL, raw)
		}
		f.endpoints = append(f.endpoints, endpoint{facade: raw, host: hostPort(u)})
	}
	return f, nil
}

// Current is the facade requests go to now.
func (f *Failover) Current() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.endpoints[f.cur].String()
}

// RoundTrip sends req to the current facade, failing over as the type's doc says.
func (f *Failover) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	body, replay, err := readBody(req)
	if err != nil {
		return nil, err
	}
	var (
		first   time.Time
		backoff = f.cfg.Backoff
		tried   []string
	)
	for {
		ep := f.current(ctx)
		out := req.Clone(ctx)
		out.URL.Scheme, out.URL.Host, out.Host = "https", ep.host, ep.host
		if body != nil {
			out.Body = body()
			out.GetBody = func() (io.ReadCloser, error) { return body(), nil }
		}
		resp, err := f.cfg.Next.RoundTrip(out)
		if err == nil && !gatewayFailure(resp) {
			return resp, nil
		}
		if err == nil {
			err = fmt.Errorf("%s from a gateway", resp.Status)
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if !replay {
			return nil, fmt.Errorf("executor: facade %s: %w (a body this large is not sent again)", ep, err)
		}
		f.failed(ep, err)
		tried = append(tried, fmt.Sprintf("%s: %v", ep, err))
		now := f.cfg.Now()
		if first.IsZero() {
			first = now
		}
		if now.Add(backoff).Sub(first) > f.cfg.Budget {
			return nil, fmt.Errorf("%w: %s %s failed for %s; tried %s", ErrNoFacade, req.Method, req.URL.Path, f.cfg.Budget, summarize(tried))
		}
		if err := f.cfg.Sleep(ctx, backoff); err != nil {
			return nil, err
		}
		backoff = min(2*backoff, f.cfg.MaxBackoff)
	}
}

// current returns the endpoint to send to, resolving the list's names on first use.
func (f *Failover) current(ctx context.Context) endpoint {
	f.mu.Lock()
	resolved := f.resolved
	f.mu.Unlock()
	if !resolved {
		eps := f.resolve(ctx)
		f.mu.Lock()
		if !f.resolved {
			f.endpoints, f.cur, f.resolved = eps, 0, true
		}
		f.mu.Unlock()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.endpoints[f.cur]
}

// resolve expands each facade whose host name has several addresses into one endpoint per
// address; a name with one address, or one that does not resolve now, stays a name (dialled,
// and so resolved, per connection).
func (f *Failover) resolve(ctx context.Context) []endpoint {
	var eps []endpoint
	for _, raw := range f.cfg.Facades {
		u, _ := url.Parse(raw) // checked in NewFailover
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = "443"
		}
		ep := endpoint{facade: raw, host: net.JoinHostPort(host, port)}
		if net.ParseIP(host) != nil {
			eps = append(eps, ep)
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := f.cfg.Resolve(rctx, host)
		cancel()
		if err != nil || len(addrs) < 2 {
			eps = append(eps, ep)
			continue
		}
		for _, a := range addrs {
			eps = append(eps, endpoint{facade: raw, host: net.JoinHostPort(a, port)})
		}
	}
	return eps
}

// failed moves the failover past ep, unless another request has moved it already. After the
// last endpoint it resolves the names again on the next request: a facade may have moved.
func (f *Failover) failed(ep endpoint, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.endpoints[f.cur] != ep {
		return
	}
	f.cur++
	if f.cur == len(f.endpoints) {
		f.cur, f.resolved = 0, false
	}
	f.cfg.Log.Warn().Err(err).Str("facade", ep.String()).Str("next", f.endpoints[f.cur].String()).
		Msg("facade unreachable; failing over to the next")
}

// gatewayFailure reports whether resp is a 502, 503 or 504 that is not the facade's own
// answer: the facade answers errors as connect errors, in JSON (CodeUnavailable included,
// which asks the caller itself to retry).
func gatewayFailure(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return false
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return ct != "application/json"
}

// readBody reads req's body so that it can be sent again: body returns a fresh reader of it
// (nil without a body). replay is false when the body is larger than maxReplayBytes: body then
// returns, once, what was read followed by the rest.
func readBody(req *http.Request) (body func() io.ReadCloser, replay bool, err error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, true, nil
	}
	data, err := io.ReadAll(io.LimitReader(req.Body, maxReplayBytes+1))
	if err != nil {
		req.Body.Close()
		return nil, false, fmt.Errorf("executor: read request body: %w", err)
	}
	if len(data) > maxReplayBytes {
		rest := req.Body
		return func() io.ReadCloser {
			return struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(data), rest), rest}
		}, false, nil
	}
	req.Body.Close()
	return func() io.ReadCloser { return io.NopCloser(bytes.NewReader(data)) }, true, nil
}

// summarize lists the attempts' failures, each distinct one once with its count.
func summarize(tried []string) string {
	var out []string
	count := map[string]int{}
	for _, t := range tried {
		if count[t] == 0 {
			out = append(out, t)
		}
		count[t]++
	}
	for i, t := range out {
		if n := count[t]; n > 1 {
			out[i] = fmt.Sprintf("%s (%d times)", t, n)
		}
	}
	return strings.Join(out, "; ")
}
