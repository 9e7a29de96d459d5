package opensandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/clock"
)

// maxBody bounds how much of an answer the client reads.
const maxBody = 8 << 20

// client sends the API's requests with the key, per-request timeouts and bounded retries.
type client struct {
	base    string
	key     []byte
	hc      *http.Client
	timeout time.Duration
	retries int
	// backoff between retries: base·2^n, at most max, with jitter.
	backoffBase, backoffMax time.Duration
	maxRetryWait            time.Duration
	log                     zerolog.Logger
}

// call is one API request.
type call struct {
	method, path string
	query        url.Values
	body         any
	// want is the status of success.
	want int
	// out receives the decoded answer of success, if not nil.
	out any
	// idempotent requests are retried after 5xx answers, timeouts and transport failures;
	// every request is retried after 429, which the server answers before doing anything.
	idempotent bool
	// secrets in the body are redacted from the server's answers should it echo them, as
	// validation errors do.
	secrets [][]byte
}

// do sends c, retrying as c allows, and returns the final answer's error.
func (cl *client) do(ctx context.Context, c call) error {
	var body []byte
	if c.body != nil {
		var err error
		if body, err = json.Marshal(c.body); err != nil {
			return fmt.Errorf("%s %s: encode: %w", c.method, c.path, err)
		}
	}
	for attempt := 1; ; attempt++ {
		err := cl.once(ctx, c, body)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", c.method, c.path, ctx.Err())
		}
		var (
			apiErr *APIError
			trErr  *transportError
			wait   time.Duration
		)
		switch {
		case errors.As(err, &apiErr):
			apiErr.Attempts = attempt
			if !apiErr.retryable() || (!c.idempotent && apiErr.Status != http.StatusTooManyRequests) {
				return err
			}
			wait = apiErr.RetryAfter
			if wait > cl.maxRetryWait {
				return fmt.Errorf("%w: the server asks for a pause of %v, longer than the %v the backend waits", err, wait, cl.maxRetryWait)
			}
		case errors.As(err, &trErr):
			trErr.attempts = attempt
			if !c.idempotent {
				return err
			}
		default:
			return err
		}
		if attempt > cl.retries {
			return err
		}
		if wait == 0 {
			wait = cl.backoff(attempt)
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("%w (no time left for a retry in %v)", err, wait)
		}
		cl.log.Warn().Err(err).Str("method", c.method).Str("path", c.path).Int("attempt", attempt).
			Dur("retry_in", wait).Msg("OpenSandbox request failed; retrying")
		if err := clock.Sleep(ctx, wait); err != nil {
			return fmt.Errorf("%s %s: %w", c.method, c.path, err)
		}
	}
}

// once sends c once, bounded by the client's timeout.
func (cl *client) once(ctx context.Context, c call, body []byte) error {
	rctx, cancel := context.WithTimeout(ctx, cl.timeout)
	defer cancel()
	u := cl.base + c.path
	if len(c.query) > 0 {
		u += "?" + c.query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(rctx, c.method, u, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", c.method, c.path, err)
	}
	req.Header.Set(apiKeyHeader, string(cl.key))
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "dynrunner-vmworker")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := cl.hc.Do(req)
	if err != nil {
		return &transportError{method: c.method, path: c.path, timeout: cl.timeout,
			timedOut: errors.Is(rctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil, err: stripURL(err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return &transportError{method: c.method, path: c.path, timeout: cl.timeout,
			timedOut: errors.Is(rctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil, err: fmt.Errorf("read answer: %w", stripURL(err))}
	}
	if resp.StatusCode != c.want {
		return cl.apiError(c, resp, data)
	}
	if c.out == nil {
		return nil
	}
	if err := json.Unmarshal(data, c.out); err != nil {
		return fmt.Errorf("%s %s: %w: %d answer is not the API's JSON (%w): %q", c.method, c.path, ErrMalformed,
			resp.StatusCode, err, cl.sanitize(string(data[:min(len(data), 80)]), c))
	}
	return nil
}

// apiError builds the error of an unexpected answer.
func (cl *client) apiError(c call, resp *http.Response, data []byte) *APIError {
	e := &APIError{Method: c.method, Path: c.path, Status: resp.StatusCode,
		RequestID:  cl.sanitize(resp.Header.Get(requestIDHeader), c),
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	var er errorResponse
	if json.Unmarshal(data, &er) == nil && (er.Code != "" || er.Message != "") {
		e.Code, e.Message = cl.sanitize(er.Code, c), cl.sanitize(er.Message, c)
	} else if len(data) > 0 {
		e.Message = cl.sanitize(string(data), c)
	}
	return e
}

// sanitize cleans server text of the key and c's secrets.
func (cl *client) sanitize(s string, c call) string {
	return sanitize(s, append([][]byte{cl.key}, c.secrets...)...)
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date. It returns zero
// for an absent or unreadable header.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		return time.Duration(min(n, 1<<20)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), (1<<20)*time.Second)
	}
	return 0
}

// backoff is the pause before retry n (1, 2, ...): exponential with jitter, bounded.
func (cl *client) backoff(n int) time.Duration {
	d := cl.backoffBase << min(n-1, 20)
	if d <= 0 || d > cl.backoffMax {
		d = cl.backoffMax
	}
	return d/2 + rand.N(d/2+1)
}

// stripURL drops the URL a *url.Error carries: the message names the method and path already.
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
