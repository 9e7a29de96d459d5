package spiretest_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/dynrunner/dynrunner/internal/kubetest"
	"github.com/dynrunner/dynrunner/internal/spiretest"
)

// helperEnv makes the test binary, inside the test image, play the workload it names.
const helperEnv = "SPIRETEST_HELPER"

const trustDomain = "spiretest.example"

// Bounds of the waits for an SVID.
const (
	svidTimeout      = 30 * time.Second
	containerTimeout = 90 * time.Second
)

// What the "fetch" workload prints: one line per SVID, then when it had them.
const (
	svidPrefix = "svid "
	atPrefix   = "at "
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	code := m.Run()
	kubetest.RemoveTestBinaryImage()
	os.Exit(code)
}

// helper plays a workload in a container. "fetch" polls the Workload API at
// SPIFFE_ENDPOINT_SOCKET until it hands out X509-SVIDs, then prints their IDs and the time.
func helper(mode string) int {
	if mode != "fetch" {
		fmt.Fprintf(os.Stderr, "spiretest helper: unknown mode %q\n", mode)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), containerTimeout-10*time.Second)
	defer cancel()
	ids, err := fetchSVIDs(ctx, os.Getenv("SPIFFE_ENDPOINT_SOCKET"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "spiretest helper: %v\n", err)
		return 1
	}
	for _, id := range ids {
		fmt.Println(svidPrefix + id.String())
	}
	fmt.Println(atPrefix + strconv.FormatInt(time.Now().UnixNano(), 10))
	return 0
}

// fetchSVIDs polls the Workload API at addr until it hands out X509-SVIDs and returns their
// IDs. The agent answers PermissionDenied until an entry matches the caller.
func fetchSVIDs(ctx context.Context, addr string) ([]spiffeid.ID, error) {
	var last error
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		x509, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr(addr))
		if err == nil {
			var ids []spiffeid.ID
			for _, svid := range x509.SVIDs {
				ids = append(ids, svid.ID)
			}
			return ids, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no SVID from %s: %w (last: %w)", addr, ctx.Err(), last)
		case <-time.After(pause):
		}
	}
}

func TestHostWorkload(t *testing.T) {
	s := spiretest.Start(t, trustDomain)
	if got, want := s.EndpointSocket(), "unix://"+s.AgentSocket; got != want {
		t.Errorf("EndpointSocket() = %q, want %q", got, want)
	}
	if got, want := s.AgentID.Path(), "/spire/agent/join_token/"; !strings.HasPrefix(got, want) || s.AgentID.TrustDomain() != s.TrustDomain {
		t.Errorf("AgentID = %s, want spiffe://%s%s<token>", s.AgentID, trustDomain, want)
	}
	checkSocketDir(t, s)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want := spiffeid.RequireFromPath(s.TrustDomain, "/test/host")
	selectors := []string{"unix:uid:" + strconv.Itoa(os.Getuid()), "unix:path:" + exe}
	began := time.Now()
	created := s.CreateEntry(t, want.String(), s.AgentID.String(), selectors...)
	if created.ID == "" || created.SPIFFEID != want || created.ParentID != s.AgentID {
		t.Errorf("CreateEntry = %+v, want an ID, %s, parent %s", created, want, s.AgentID)
	}

	ctx, cancel := context.WithTimeout(t.Context(), svidTimeout)
	defer cancel()
	ids, err := fetchSVIDs(ctx, s.EndpointSocket())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SVID %v %v after the entry's creation", ids, time.Since(began).Round(time.Millisecond))
	if len(ids) != 1 || ids[0] != want {
		t.Errorf("SVIDs = %v, want [%s]", ids, want)
	}

	entries := s.Entries(t)
	i := slices.IndexFunc(entries, func(e spiretest.Entry) bool { return e.ID == created.ID })
	if i < 0 {
		t.Fatalf("Entries() = %+v, lacks %s", entries, created.ID)
	}
	if got := entries[i]; got.SPIFFEID != want || got.ParentID != s.AgentID ||
		!slices.Equal(slices.Sorted(slices.Values(got.Selectors)), slices.Sorted(slices.Values(selectors))) {
		t.Errorf("Entries() has %+v, want %s, parent %s, selectors %q", got, want, s.AgentID, selectors)
	}
	s.DeleteEntry(t, created.ID)
	if entries := s.Entries(t); slices.ContainsFunc(entries, func(e spiretest.Entry) bool { return e.ID == created.ID }) {
		t.Errorf("Entries() after DeleteEntry = %+v, still has %s", entries, created.ID)
	}
}

// checkSocketDir checks that AgentSocketDir holds only the socket, and that both are open to
// every user.
func checkSocketDir(t *testing.T, s *spiretest.SPIRE) {
	t.Helper()
	des, err := os.ReadDir(s.AgentSocketDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(des) != 1 || filepath.Join(s.AgentSocketDir, des[0].Name()) != s.AgentSocket {
		t.Errorf("%s holds %v, want only %s", s.AgentSocketDir, des, filepath.Base(s.AgentSocket))
	}
	if fi, err := os.Stat(s.AgentSocketDir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("%s: %v, %v; want mode 0755", s.AgentSocketDir, fi.Mode(), err)
	}
	if fi, err := os.Stat(s.AgentSocket); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o777 {
		t.Errorf("%s: %v, %v; want a socket of mode 0777", s.AgentSocket, fi.Mode(), err)
	}
}

// TestDockerWorkloadAttestor runs the test binary in a container, as a non-root user with only
// the agent's socket directory mounted, and registers it by a label the way a Pod's
// container is.
func TestDockerWorkloadAttestor(t *testing.T) {
	s := spiretest.Start(t, trustDomain)
	image := kubetest.TestBinaryImageID(t) // skips without the Docker engine
	podUID := newUUID(t)
	const socketDir = "/run/spire/sockets"
	id := runContainer(t, containerSpec{
		Image: image,
		User:  "65534:65534",
		Env: []string{
			helperEnv + "=fetch",
			"SPIFFE_ENDPOINT_SOCKET=unix://" + socketDir + "/" + filepath.Base(s.AgentSocket),
		},
		Labels: map[string]string{"io.kubernetes.pod.uid": podUID},
		HostConfig: hostConfig{
			Binds:       []string{s.AgentSocketDir + ":" + socketDir + ":ro"},
			NetworkMode: "none",
		},
	})

	want := spiffeid.RequireFromPath(s.TrustDomain, "/test/container")
	began := time.Now()
	s.CreateEntry(t, want.String(), s.AgentID.String(), "docker:label:io.kubernetes.pod.uid:"+podUID)
	code := waitContainer(t, id)
	out := containerLogs(t, id)
	if code != 0 {
		t.Fatalf("container exited %d:\n%s", code, out)
	}
	var ids []string
	var at int64
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), svidPrefix); ok {
			ids = append(ids, v)
		}
		if v, ok := strings.CutPrefix(sc.Text(), atPrefix); ok {
			at, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if len(ids) != 1 || ids[0] != want.String() {
		t.Fatalf("the container's SVIDs = %q, want [%s]; output:\n%s", ids, want, out)
	}
	t.Logf("the container had %s %v after the entry's creation (exited after %v)",
		want, time.Unix(0, at).Sub(began).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// newUUID returns a random (version 4) UUID.
func newUUID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// The Docker Engine API, as much of it as the test needs.

var engineHTTP = &http.Client{Transport: &http.Transport{
	DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", spiretest.DockerSocket)
	},
}}

type containerSpec struct {
	Image      string            `json:"Image"`
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
	HostConfig hostConfig        `json:"HostConfig"`
}

type hostConfig struct {
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

// runContainer creates and starts a container; the test's cleanup removes it.
func runContainer(t *testing.T, spec containerSpec) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var created struct {
		ID string `json:"Id"`
	}
	if err := engine(ctx, http.MethodPost, "/containers/create", spec, &created); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := engine(ctx, http.MethodDelete, "/containers/"+created.ID+"?force=1", nil, nil); err != nil {
			t.Errorf("remove the container: %v", err)
		}
	})
	if err := engine(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil); err != nil {
		t.Fatal(err)
	}
	return created.ID
}

// waitContainer waits until the container exits and returns its exit code.
func waitContainer(t *testing.T, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), containerTimeout)
	defer cancel()
	var res struct {
		StatusCode int `json:"StatusCode"`
	}
	if err := engine(ctx, http.MethodPost, "/containers/"+id+"/wait", nil, &res); err != nil {
		t.Fatalf("wait for the container: %v; its output:\n%s", err, containerLogs(t, id))
	}
	return res.StatusCode
}

// containerLogs returns the container's stdout and stderr, interleaved.
func containerLogs(t *testing.T, id string) string {
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
