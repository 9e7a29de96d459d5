package spiretest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// ContainerTimeout bounds WaitContainer.
const ContainerTimeout = 90 * time.Second

// The Docker Engine API, as much of it as tests of workload attestation need: run a labelled
// container with the agent socket mounted, read its output, remove it.

var engineHTTP = &http.Client{Transport: &http.Transport{
	DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", DockerSocket)
	},
}}

// ContainerSpec is the body of a container create request.
type ContainerSpec struct {
	Image      string            `json:"Image"`
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
	HostConfig HostConfig        `json:"HostConfig"`
}

// HostConfig is the part of ContainerSpec.HostConfig tests set.
type HostConfig struct {
	Binds       []string `json:"Binds,omitempty"`
	NetworkMode string   `json:"NetworkMode,omitempty"`
}

// engine calls the engine's API and decodes its answer into out (when not nil); an answer
// outside 2xx is an error.
func engine(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := engineHTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("docker engine: %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	if f, ok := out.(*[]byte); ok {
		*f = b
		return nil
	}
	return json.Unmarshal(b, out)
}

// RunContainer creates and starts a container; the test's cleanup removes it.
func RunContainer(t *testing.T, spec ContainerSpec) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var created struct {
		ID string `json:"Id"`
	}
	if err := engine(ctx, http.MethodPost, "/containers/create", spec, &created); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveContainer(t, created.ID) })
	if err := engine(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil); err != nil {
		t.Fatal(err)
	}
	return created.ID
}

// WaitContainer waits until the container exits and returns its exit code.
func WaitContainer(t *testing.T, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), ContainerTimeout)
	defer cancel()
	var res struct {
		StatusCode int `json:"StatusCode"`
	}
	if err := engine(ctx, http.MethodPost, "/containers/"+id+"/wait", nil, &res); err != nil {
		t.Fatalf("wait for the container: %v; its output:\n%s", err, ContainerLogs(t, id))
	}
	return res.StatusCode
}

// ContainerLogs returns the container's stdout and stderr, interleaved.
func ContainerLogs(t *testing.T, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var raw []byte
	if err := engine(ctx, http.MethodGet, "/containers/"+id+"/logs?stdout=1&stderr=1", nil, &raw); err != nil {
		t.Fatal(err)
	}
	// Without a TTY the log is a stream of frames: 1 byte stream, 3 zero, 4 length (big
	// endian), then the payload.
	var out strings.Builder
	for len(raw) >= 8 {
		n := int(binary.BigEndian.Uint32(raw[4:8]))
		raw = raw[8:]
		n = min(n, len(raw))
		out.Write(raw[:n])
		raw = raw[n:]
	}
	return out.String()
}

// RemoveContainer removes a container, running or not; a missing one is no error.
func RemoveContainer(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := engine(ctx, http.MethodDelete, "/containers/"+id+"?force=1", nil, nil); err != nil && !strings.Contains(err.Error(), "404") {
		t.Errorf("remove container %s: %v", id, err)
	}
}
