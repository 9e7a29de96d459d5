package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Engine API versions the backend speaks. It asks for the engine's own version, capped at
// maxAPIVersion; engines older than minAPIVersion (Docker 20.10) are refused.
const (
	minAPIVersion = "1.41"
	maxAPIVersion = "1.47"
)

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// engine is a minimal client of the Docker Engine API over its unix socket.
type engine struct {
	socket string
	hc     *http.Client

	mu      sync.Mutex
	version string // negotiated API version; "" until the first successful ping
}

func newEngine(socket string) *engine {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	// No client timeout: wait and stop calls block for as long as their context allows.
	return &engine{socket: socket, hc: &http.Client{Transport: tr}}
}

func (e *engine) close() { e.hc.CloseIdleConnections() }

// apiError is a non-success answer of the engine.
type apiError struct {
	status int
	op     string
	msg    string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s: engine answered %d: %s", e.op, e.status, e.msg)
}

// statusOf returns the HTTP status of an engine error, or 0.
func statusOf(err error) int {
	if ae, ok := errors.AsType[*apiError](err); ok {
		return ae.status
	}
	return 0
}

func isNotFound(err error) bool { return statusOf(err) == http.StatusNotFound }

// apiVersion negotiates the API version once: the engine's, capped at maxAPIVersion.
func (e *engine) apiVersion(ctx context.Context) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.version != "" {
		return e.version, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", nil)
	if err != nil {
		return "", err
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("engine at %s: %w", e.socket, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("engine at %s: ping answered %s", e.socket, resp.Status)
	}
	server := resp.Header.Get("Api-Version")
	if server == "" {
		return "", fmt.Errorf("engine at %s: ping names no API version", e.socket)
	}
	if versionLess(server, minAPIVersion) {
		return "", fmt.Errorf("engine at %s speaks API %s, need %s (Docker 20.10) or newer: %w", e.socket, server, minAPIVersion, ErrEngineTooOld)
	}
	e.version = server
	if versionLess(maxAPIVersion, server) {
		e.version = maxAPIVersion
	}
	return e.version, nil
}

// versionLess compares API versions "major.minor" numerically.
func versionLess(a, b string) bool {
	pa, pb := versionParts(a), versionParts(b)
	if pa[0] != pb[0] {
		return pa[0] < pb[0]
	}
	return pa[1] < pb[1]
}

func versionParts(v string) [2]int {
	maj, mnr, _ := strings.Cut(v, ".")
	a, _ := strconv.Atoi(maj)
	b, _ := strconv.Atoi(mnr)
	return [2]int{a, b}
}

// do sends a request to the versioned API and returns the response when its status is 2xx or
// 304; otherwise it returns an *apiError. The caller closes the body.
func (e *engine) do(ctx context.Context, method, path string, q url.Values, in any) (*http.Response, error) {
	op := method + " " + path
	v, err := e.apiVersion(ctx)
	if err != nil {
		return nil, err
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	u := "http://docker/v" + v + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusNotModified {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var msg struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &msg) != nil || msg.Message == "" {
		msg.Message = strings.TrimSpace(string(raw))
	}
	return nil, &apiError{status: resp.StatusCode, op: op, msg: msg.Message}
}

// call is do for JSON answers: it decodes the body into out when out is not nil.
func (e *engine) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	resp, err := e.do(ctx, method, path, q, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}
