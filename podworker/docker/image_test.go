package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

// engineHTTP is an HTTP client of the engine's socket, independent of the package under test.
var engineHTTP = &http.Client{Transport: &http.Transport{
	DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", docker.DefaultSocket)
	},
}}

// engineJSON calls the engine's API (unversioned path) and decodes its answer into out.
func engineJSON(ctx context.Context, method, path string, body io.Reader, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+path, body)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := engineHTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// needDocker skips the test when the engine does not answer, and fails it in CI.
func needDocker(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real containers on the Docker engine; run without -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	code, err := engineJSON(ctx, http.MethodGet, "/_ping", nil, nil)
	if err == nil && code == http.StatusOK {
		return
	}
	msg := fmt.Sprintf("the Docker engine at %s does not answer (%v, status %d); start it with `systemctl start docker` (or `dockerd &`) and run as root or a member of the docker group",
		docker.DefaultSocket, err, code)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// The test image: FROM scratch with a static build of this test binary as its entrypoint.
// testImage is the test binary in a FROM scratch image (built once per process by kubetest).
func testImage(t *testing.T) string {
	t.Helper()
	needDocker(t)
	return kubetest.TestBinaryImageID(t)
}
