package kubetest

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
	"os"
	"testing"
	"time"
)

// DockerSocket is the Docker engine's socket the Kubelet runs containers on.
const DockerSocket = "/var/run/docker.sock"

// engine is a small client of the Docker Engine API over its unix socket.
type engine struct {
	hc *http.Client
}

func newEngine(socket string) *engine {
	return &engine{hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 8,
	}}}
}

// engineError is an answer of the engine outside 2xx.
type engineError struct {
	status int
	msg    string
}

func (e *engineError) Error() string { return fmt.Sprintf("docker engine: %d: %s", e.status, e.msg) }

func isNotFound(err error) bool {
	var ee *engineError
	return errors.As(err, &ee) && ee.status == http.StatusNotFound
}

// do sends a request and returns the response when its status is 2xx; the caller closes it.
func (e *engine) do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u := "http://docker" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var msg struct {
			Message string `json:"message"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &msg) != nil || msg.Message == "" {
			msg.Message = string(bytes.TrimSpace(b))
		}
		return nil, &engineError{status: resp.StatusCode, msg: msg.Message}
	}
	return resp, nil
}

// call sends in as JSON (when not nil) and decodes the answer into out (when not nil).
func (e *engine) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := e.do(ctx, method, path, q, body, ctype)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (e *engine) close() { e.hc.CloseIdleConnections() }

// NeedDocker skips the test when the Docker engine does not answer at DockerSocket (fails it
// when the environment variable CI is set), and with -short.
func NeedDocker(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("kubetest: runs containers on the Docker engine; run without -short")
	}
	eng := newEngine(DockerSocket)
	defer eng.close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := eng.call(ctx, http.MethodGet, "/_ping", nil, nil, nil)
	if err == nil {
		return
	}
	msg := fmt.Sprintf("kubetest: the Docker engine at %s does not answer (%v); start it with `systemctl start docker` (or `dockerd &`) and run as root or a member of the docker group", DockerSocket, err)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
