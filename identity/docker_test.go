package identity_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dynrunner/dynrunner/identity"
	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/internal/testbed/spiretest"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

// helperEnv makes the test binary, inside the test image, play a job container: it prints
// the SPIFFE ID of the SVID the Workload API at SPIFFE_ENDPOINT_SOCKET hands it (svidPrefix),
// then sleeps until it is removed.
const helperEnv = "IDENTITY_TEST_HELPER"

const svidPrefix = "svid "

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helper())
	}
	code := m.Run()
	kubetest.RemoveTestBinaryImage()
	os.Exit(code)
}

func helper() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		x509, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr(os.Getenv("SPIFFE_ENDPOINT_SOCKET")))
		if err == nil {
			for _, svid := range x509.SVIDs {
				fmt.Println(svidPrefix + svid.ID.String())
			}
			break
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "identity helper: no SVID: %v\n", err)
			time.Sleep(time.Hour)
			return 1
		case <-time.After(pause):
		}
	}
	time.Sleep(time.Hour)
	return 0
}

// TestDockerSource runs job containers on the real Docker engine beside a real SPIRE server
// and agent (docker workload attestor): a running container of the scope gets an entry whose
// selectors the attestor matches, so it receives its assignment's SVID; a container of another
// scope gets none; and the entry goes when the container is removed.
func TestDockerSource(t *testing.T) {
	sp := spiretest.Start(t, trustDomain)
	image := kubetest.TestBinaryImageID(t) // skips without the Docker engine
	conn, err := grpc.NewClient("unix://"+sp.ServerSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	e := &env{entries: entryv1.NewEntryClient(conn), spire: sp, parent: sp.AgentID}

	scope := "idt" + randomHex(t, 4)
	e.hint = identity.HintFor(identity.SourceDocker, scope)
	inv, err := docker.NewInventory(docker.DefaultSocket, scope)
	require.NoError(t, err)
	t.Cleanup(func() { _ = inv.Close() })
	// A resync of an hour: entries follow the engine's events.
	e.run(t, identity.Config{
		Source: identity.SourceDocker, Docker: inv, Entries: e.entries,
		TrustDomain: spiffeid.RequireTrustDomainFromString(trustDomain), ParentID: e.parent,
		SVIDTTL: 5 * time.Minute, Resync: time.Hour,
		Log: zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger(),
	})

	const socketDir = "/run/spire/sockets"
	job := func(scope, task, epoch string) string {
		return spiretest.RunContainer(t, spiretest.ContainerSpec{
			Image: image, User: "65534:65534",
			Env: []string{helperEnv + "=1", "SPIFFE_ENDPOINT_SOCKET=unix://" + socketDir + "/" + filepath.Base(sp.AgentSocket)},
			Labels: map[string]string{
				docker.LabelManaged: "true", docker.LabelScope: scope,
				docker.LabelTask: task, docker.LabelEpoch: epoch,
			},
			HostConfig: spiretest.HostConfig{Binds: []string{sp.AgentSocketDir + ":" + socketDir + ":ro"}, NetworkMode: "none"},
		})
	}
	mine := job(scope, "5", "2")
	job(scope+"x", "6", "1")      // another scope's
	job(scope, "not-a-task", "1") // labels that do not parse

	entryID := "dynrunner-ctr-" + mine
	want := "spiffe://" + trustDomain + "/dynrunner/task/5/epoch/2"
	poll(t, "the running container has an entry", func() bool { _, ok := e.owned(t)[entryID]; return ok })
	en := e.owned(t)[entryID]
	wantSel := []string{"docker:label:dynrunner.epoch:2", "docker:label:dynrunner.scope:" + scope, "docker:label:dynrunner.task:5"}
	assert.Equal(t, want, idOf(en.SpiffeId), "entry %s: SPIFFE ID", entryID)
	assert.Equal(t, e.parent.String(), idOf(en.ParentId), "entry %s: parent", entryID)
	assert.Equal(t, wantSel, selectorStrings(en), "entry %s: selectors", entryID)
	assert.EqualValues(t, 300, en.X509SvidTtl, "entry %s: X.509-SVID TTL", entryID)
	assert.Equal(t, "dynrunner-identity-docker-"+scope, en.Hint, "entry %s: hint", entryID)
	// The agent's docker workload attestor matches the entry: the container has its SVID.
	poll(t, "the container received its SVID", func() bool {
		return strings.Contains(spiretest.ContainerLogs(t, mine), svidPrefix+want+"\n")
	})
	for id, en := range e.owned(t) {
		assert.Equal(t, entryID, id, "unexpected entry %s (%s): only the scope's container with valid labels gets one", id, idOf(en.SpiffeId))
	}

	spiretest.RemoveContainer(t, mine)
	poll(t, "the removed container's entry is deleted", func() bool { return len(e.owned(t)) == 0 })
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}
