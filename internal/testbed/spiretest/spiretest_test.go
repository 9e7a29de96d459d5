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
	"github.com/stretchr/testify/assert"
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
	assert.Equal(t, "unix://"+s.AgentSocket, s.EndpointSocket(), "EndpointSocket()")
	assert.True(t, strings.HasPrefix(s.AgentID.Path(), "/spire/agent/join_token/"), "AgentID = %s, want spiffe://%s/spire/agent/join_token/<token>", s.AgentID, trustDomain)
	assert.Equal(t, s.TrustDomain, s.AgentID.TrustDomain(), "AgentID = %s, want spiffe://%s/spire/agent/join_token/<token>", s.AgentID, trustDomain)
	checkSocketDir(t, s)

	exe, err := os.Executable()
	require.NoError(t, err)
	want := spiffeid.RequireFromPath(s.TrustDomain, "/test/host")
	selectors := []string{"unix:uid:" + strconv.Itoa(os.Getuid()), "unix:path:" + exe}
	began := time.Now()
	created := s.CreateEntry(t, want.String(), s.AgentID.String(), selectors...)
	assert.NotEmpty(t, created.ID, "CreateEntry = %+v, want an ID", created)
	assert.Equal(t, want, created.SPIFFEID, "CreateEntry SPIFFE ID")
	assert.Equal(t, s.AgentID, created.ParentID, "CreateEntry parent")

	ctx, cancel := context.WithTimeout(t.Context(), svidTimeout)
	defer cancel()
	ids, err := fetchSVIDs(ctx, s.EndpointSocket())
	require.NoError(t, err)
	t.Logf("SVID %v %v after the entry's creation", ids, time.Since(began).Round(time.Millisecond))
	assert.Equal(t, []spiffeid.ID{want}, ids, "SVIDs")

	entries := s.Entries(t)
	i := slices.IndexFunc(entries, func(e spiretest.Entry) bool { return e.ID == created.ID })
	require.GreaterOrEqual(t, i, 0, "Entries() = %+v, lacks %s", entries, created.ID)
	got := entries[i]
	assert.Equal(t, want, got.SPIFFEID, "Entries() has %+v", got)
	assert.Equal(t, s.AgentID, got.ParentID, "Entries() has %+v", got)
	assert.ElementsMatch(t, selectors, got.Selectors, "Entries() has %+v", got)
	s.DeleteEntry(t, created.ID)
	entries = s.Entries(t)
	assert.False(t, slices.ContainsFunc(entries, func(e spiretest.Entry) bool { return e.ID == created.ID }), "Entries() after DeleteEntry = %+v, still has %s", entries, created.ID)
}

// checkSocketDir checks that AgentSocketDir holds only the socket, and that both are open to
// every user.
func checkSocketDir(t *testing.T, s *spiretest.SPIRE) {
	t.Helper()
	des, err := os.ReadDir(s.AgentSocketDir)
	require.NoError(t, err)
	if assert.Len(t, des, 1, "%s holds %v, want only %s", s.AgentSocketDir, des, filepath.Base(s.AgentSocket)) {
		assert.Equal(t, s.AgentSocket, filepath.Join(s.AgentSocketDir, des[0].Name()), "%s holds %v, want only %s", s.AgentSocketDir, des, filepath.Base(s.AgentSocket))
	}
	if fi, err := os.Stat(s.AgentSocketDir); assert.NoError(t, err) {
		assert.EqualValues(t, 0o755, fi.Mode().Perm(), "%s: %v; want mode 0755", s.AgentSocketDir, fi.Mode())
	}
	if fi, err := os.Stat(s.AgentSocket); assert.NoError(t, err) {
		assert.Equal(t, os.ModeSocket, fi.Mode().Type(), "%s: %v; want a socket of mode 0777", s.AgentSocket, fi.Mode())
		assert.EqualValues(t, 0o777, fi.Mode().Perm(), "%s: %v; want a socket of mode 0777", s.AgentSocket, fi.Mode())
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
	require.Equal(t, []string{want.String()}, ids, "the container's SVIDs; output:\n%s", out)
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
