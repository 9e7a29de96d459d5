package fleetbed

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestNATSClusterReplicates starts the bed's NATS cluster alone and checks that an R3 stream
// lives on all three nodes and survives `docker kill` of one of them.
func TestNATSClusterReplicates(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containers")
	}
	ctx := t.Context()
	if err := NeedDocker(ctx); err != nil {
		if os.Getenv("CI") != "" {
			require.NoError(t, err, "CI provides docker")
		}
		t.Skip(err)
	}
	im, err := BuildImages(ctx)
	require.NoError(t, err)
	b := &Bed{ID: randomHex(4), Images: im, opts: Options{Dir: t.TempDir(), Output: testWriter{t}}}
	b.Network = "fleetbed-" + b.ID
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	_, err = docker(ctx, append(append([]string{"network", "create"}, labels(b.ID)...), b.Network)...)
	require.NoError(t, err)
	b.natsPass = randomHex(24)
	require.NoError(t, b.startNATS(ctx))

	url, err := b.NATSHostURL(ctx)
	require.NoError(t, err)
	user, pass := b.NATSCredentials()
	nc, err := nats.Connect(url, nats.UserInfo(user, pass), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var s jetstream.Stream
	require.Eventually(t, func() bool {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err = js.CreateStream(c, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
		return err == nil
	}, time.Minute, 500*time.Millisecond, "create an R3 stream: %v", err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Len(t, info.Cluster.Replicas, 2, "followers of the R3 stream")

	require.NoError(t, b.Container(info.Cluster.Leader).Kill(ctx))
	require.Eventually(t, func() bool {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = js.Publish(c, "t.1", []byte("after the leader died"))
		return err == nil
	}, time.Minute, 200*time.Millisecond, "publish after the stream leader was killed: %v", err)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
