package spiretest_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/internal/testbed/spiretest"
)

// helperEnv makes the test binary, inside the test image, play the workload it names.
const helperEnv = "SPIRETEST_HELPER"

const trustDomain = "spiretest.example"

// Bounds of the waits for an SVID.
const (
	svidTimeout = 30 * time.Second
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
	ctx, cancel := context.WithTimeout(context.Background(), spiretest.ContainerTimeout-10*time.Second)
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
	require.NoError(t, err)
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
	require.NoError(t, err)
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
	require.NoError(t, err)
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
	id := spiretest.RunContainer(t, spiretest.ContainerSpec{
		Image: image,
		User:  "65534:65534",
		Env: []string{
			helperEnv + "=fetch",
			"SPIFFE_ENDPOINT_SOCKET=unix://" + socketDir + "/" + filepath.Base(s.AgentSocket),
		},
		Labels: map[string]string{"io.kubernetes.pod.uid": podUID},
		HostConfig: spiretest.HostConfig{
			Binds:       []string{s.AgentSocketDir + ":" + socketDir + ":ro"},
			NetworkMode: "none",
		},
	})

	want := spiffeid.RequireFromPath(s.TrustDomain, "/test/container")
	began := time.Now()
	s.CreateEntry(t, want.String(), s.AgentID.String(), "docker:label:io.kubernetes.pod.uid:"+podUID)
	code := spiretest.WaitContainer(t, id)
	out := spiretest.ContainerLogs(t, id)
	require.EqualValues(t, 0, code, "container exited %d:\n%s", code, out)
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
	u, err := uuid.NewRandom()
	require.NoError(t, err)
	return u.String()
}
