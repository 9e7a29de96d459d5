package opensandbox

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dynrunner/dynrunner/podworker"
)

// Sentinel errors of the API calls; callers branch on them with errors.Is. A 404 answer is
// podworker.ErrNotFound.
var (
	// ErrUnauthorized: the server refused the API key (401) or the key may not do this (403).
	// Retrying cannot help; the key file must be fixed.
	ErrUnauthorized = errors.New("opensandbox: API key refused")
	// ErrConflict: the operation conflicts with the sandbox's current state (409).
	ErrConflict = errors.New("opensandbox: conflict with the sandbox's state")
	// ErrRateLimited: the server still answered 429 after the retries, or asked for a longer
	// pause than Config.MaxRetryWait.
	ErrRateLimited = errors.New("opensandbox: rate limited")
	// ErrUnavailable: 5xx answers, timeouts or transport failures outlasted the retries.
	ErrUnavailable = errors.New("opensandbox: server unavailable")
	// ErrRejected: the server refused the request as invalid (another 4xx); retrying cannot
	// help.
	ErrRejected = errors.New("opensandbox: request rejected")
	// ErrMalformed: an answer did not decode as the API's JSON.
	ErrMalformed = errors.New("opensandbox: malformed answer")
	// ErrStartTimeout: a new sandbox did not become Running within Config.StartTimeout; Start
	// deleted it.
	ErrStartTimeout = errors.New("opensandbox: sandbox never became Running")
	// ErrSandboxFailed: a new sandbox failed, terminated or vanished while starting; Start
	// deleted what was left of it.
	ErrSandboxFailed = errors.New("opensandbox: sandbox failed to start")
)

// APIError is a non-2xx answer of the server. It matches (errors.Is) the sentinel of its
// status class.
type APIError struct {
	Method, Path string
	Status       int
	// Code and Message are the server's ErrorResponse, sanitized.
	Code, Message string
	// RequestID is the server's X-Request-ID, for its logs.
	RequestID string
	// RetryAfter is the server's Retry-After, zero when absent.
	RetryAfter time.Duration
	// Attempts is how many times the request was sent.
	Attempts int
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d %s", e.Method, e.Path, e.Status, http.StatusText(e.Status))
	if e.Code != "" || e.Message != "" {
		fmt.Fprintf(&b, " (%s)", strings.TrimPrefix(e.Code+": "+e.Message, ": "))
	}
	switch {
	case e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden:
		b.WriteString(": the OpenSandbox server refused the API key; check the key file and that the key may manage sandboxes")
	case e.Status == http.StatusNotFound && e.Path == pathSandboxes:
		b.WriteString(": is the server URL the Lifecycle API's (…/v1)?")
	case e.Status == http.StatusConflict:
		b.WriteString(": the request conflicts with the sandbox's current state")
	case e.Status == http.StatusTooManyRequests:
		fmt.Fprintf(&b, ": rate limited")
		if e.RetryAfter > 0 {
			fmt.Fprintf(&b, ", the server asks to retry after %v", e.RetryAfter)
		}
	case e.Status >= 500:
		b.WriteString(": server error")
	}
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts)", e.Attempts)
	}
	if e.RequestID != "" {
		fmt.Fprintf(&b, " [request id %s]", e.RequestID)
	}
	return b.String()
}

// Unwrap returns the sentinel of the status class.
func (e *APIError) Unwrap() error {
	switch {
	case e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden:
		return ErrUnauthorized
	case e.Status == http.StatusNotFound && e.Path == pathSandboxes:
		return ErrRejected // the collection itself is missing: a wrong server URL
	case e.Status == http.StatusNotFound:
		return podworker.ErrNotFound
	case e.Status == http.StatusConflict:
		return ErrConflict
	case e.Status == http.StatusTooManyRequests:
		return ErrRateLimited
	case e.Status == http.StatusRequestTimeout || e.Status >= 500:
		return ErrUnavailable
	case e.Status >= 400:
		return ErrRejected
	}
	return ErrMalformed // a status the call did not expect, such as 200 for a create
}

// retryable reports whether sending the same request again may succeed.
func (e *APIError) retryable() bool {
	return e.Status == http.StatusTooManyRequests || e.Status == http.StatusRequestTimeout || e.Status >= 500
}

// transportError is a request that got no answer: a timeout or a network failure.
type transportError struct {
	method, path string
	timeout      time.Duration
	timedOut     bool
	attempts     int
	err          error
}

func (e *transportError) Error() string {
	what := "no answer"
	if e.timedOut {
		what = fmt.Sprintf("no answer within %v", e.timeout)
	}
	s := fmt.Sprintf("%s %s: %s: %v", e.method, e.path, what, e.err)
	if e.attempts > 1 {
		s += fmt.Sprintf(" (after %d attempts)", e.attempts)
	}
	return s
}

func (e *transportError) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// maxServerText bounds how much of the server's error text goes into an error.
const maxServerText = 300

// sanitize makes server text safe for an error or a log line: printable, one line, bounded,
// and without any of the secrets (the API key, a nonce) should the server echo them.
func sanitize(s string, secrets ...[]byte) string {
	for _, sec := range secrets {
		if len(sec) > 0 {
			s = strings.ReplaceAll(s, string(sec), "[redacted]")
		}
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, s)
	s = strings.TrimSpace(s)
	if len(s) > maxServerText {
		cut := maxServerText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	// Truncation may have cut a secret; drop any head of one that is left at the end.
	for _, sec := range secrets {
		for i := len(sec) - 1; i >= 8; i-- {
			if strings.HasSuffix(strings.TrimSuffix(s, "…"), string(sec[:i])) {
				s = strings.TrimSuffix(strings.TrimSuffix(s, "…"), string(sec[:i])) + "[redacted]…"
				break
			}
		}
	}
	return s
}
