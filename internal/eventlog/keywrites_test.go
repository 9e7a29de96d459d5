package eventlog_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog"
)

// createKeys creates n keys env.<i>.1 in BucketWorkers and returns their revisions.
func createKeys(t testing.TB, kv jetstream.KeyValue, n int) []uint64 {
	t.Helper()
	revs := make([]uint64, n)
	for i := range n {
		rev, err := kv.Create(context.Background(), fmt.Sprintf("env.%d.1", i), []byte("worker-a"))
		require.NoError(t, err)
		revs[i] = rev
	}
	return revs
}

func TestWriteWorkers(t *testing.T) {
	l, stop := openLog(t, t.TempDir())
	defer stop()
	kv := l.Workers()
	ctx := t.Context()
	// More keys than one window holds, so the pipeline waits for its oldest writes on the way.
	const n = 600
	revs := createKeys(t, kv, n)

	// Key 7 moved on since its revision was read: that write alone fails.
	moved, err := kv.Put(ctx, "env.7.1", []byte("worker-b"))
	require.NoError(t, err)
	ws := make([]eventlog.KeyWrite, n)
	for i := range n {
		ws[i] = eventlog.KeyWrite{Key: fmt.Sprintf("env.%d.1", i), Value: []byte("worker-a'"), Rev: revs[i]}
	}
	got, errs := l.WriteWorkers(ctx, ws)
	for i := range n {
		if i == 7 {
			require.ErrorIs(t, errs[i], jetstream.ErrKeyRevisionMismatch)
			assert.True(t, eventlog.KeyTaken(errs[i]))
			assert.Zero(t, got[i])
			continue
		}
		require.NoError(t, errs[i], "key %d", i)
		e, err := kv.Get(ctx, ws[i].Key)
		require.NoError(t, err)
		assert.Equal(t, e.Revision(), got[i], "key %d: the revision returned is the key's", i)
		assert.Equal(t, "worker-a'", string(e.Value()))
	}
	e, err := kv.Get(ctx, "env.7.1")
	require.NoError(t, err)
	assert.Equal(t, "worker-b", string(e.Value()), "a write at a stale revision changed nothing")

	// Deletes at the current revision remove the keys; at a stale one they leave it.
	dels := []eventlog.KeyWrite{
		{Key: "env.1.1", Rev: got[1], Delete: true},
		{Key: "env.2.1", Rev: revs[2], Delete: true},
		{Key: "env.7.1", Rev: moved, Delete: true},
	}
	_, errs = l.WriteWorkers(ctx, dels)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], jetstream.ErrKeyRevisionMismatch)
	require.NoError(t, errs[2])
	for _, k := range []string{"env.1.1", "env.7.1"} {
		_, err := kv.Get(ctx, k)
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound, k)
	}
	_, err = kv.Get(ctx, "env.2.1")
	require.NoError(t, err)

	// A done context fails every write, and writes nothing.
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, errs = l.WriteWorkers(done, []eventlog.KeyWrite{{Key: "env.3.1", Value: []byte("x"), Rev: got[3]}})
	require.ErrorIs(t, errs[0], context.Canceled)
	e, err = kv.Get(ctx, "env.3.1")
	require.NoError(t, err)
	assert.Equal(t, got[3], e.Revision())
}

// BenchmarkWriteWorkers renews 10,000 environment keys, as a pod worker's heartbeat does with
// 10,000 environments: one compare-and-swap update after another (how the heartbeat renewed
// them before), and pipelined (eventlog.Log.WriteWorkers); on the embedded server, and on a
// 3-node cluster in this process (loopback routes, the bucket R3), where every write waits
// for its replication. ms/renewal is one pass over all keys.
func BenchmarkWriteWorkers(b *testing.B) {
	const n = 10_000
	for _, bus := range []string{"embedded", "cluster"} {
		for _, mode := range []string{"sequential", "pipelined"} {
			b.Run(bus+"/"+mode, func(b *testing.B) {
				var l *eventlog.Log
				if bus == "embedded" {
					tl, stop := openLog(b, b.TempDir())
					defer stop()
					l = tl.Log
				} else {
					l = openClusterLog(b)
				}
				kv := l.Workers()
				revs := createKeys(b, kv, n)
				ws := make([]eventlog.KeyWrite, n)
				for i := range n {
					ws[i] = eventlog.KeyWrite{Key: fmt.Sprintf("env.%d.1", i), Value: []byte("worker-a"), Rev: revs[i]}
				}
				ctx := context.Background()
				b.ResetTimer()
				for b.Loop() {
					if mode == "sequential" {
						for i := range ws {
							rev, err := kv.Update(ctx, ws[i].Key, ws[i].Value, ws[i].Rev)
							if err != nil {
								b.Fatal(err)
							}
							ws[i].Rev = rev
						}
						continue
					}
					got, errs := l.WriteWorkers(ctx, ws)
					for i := range ws {
						if errs[i] != nil {
							b.Fatal(errs[i])
						}
						ws[i].Rev = got[i]
					}
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/renewal")
			})
		}
	}
}

// openClusterLog starts a 3-node JetStream cluster in this process, its routes on loopback, and
// opens a log with R3 streams and buckets on it.
func openClusterLog(b *testing.B) *eventlog.Log {
	b.Helper()
	ports := make([]int, 3)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		require.NoError(b, ln.Close())
	}
	var urls []string
	for i := range 3 {
		var routes []string
		for j, p := range ports {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
			}
		}
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: b.TempDir(), NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "bench", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		}
		s, err := server.NewServer(opts)
		require.NoError(b, err)
		go s.Start()
		b.Cleanup(s.Shutdown)
		require.True(b, s.ReadyForConnections(10*time.Second))
		urls = append(urls, s.ClientURL())
	}
	nc, err := nats.Connect(strings.Join(urls, ","))
	require.NoError(b, err)
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(b, err)
	cfg := eventlog.DefaultConfig()
	cfg.Replicas = 3
	cfg.Key = []byte("0123456789abcdef0123456789abcdef")
	var l *eventlog.Log
	// The cluster elects its meta leader after the nodes meet: retry Open until it has one.
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err = eventlog.Open(b.Context(), js, cfg)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(b, err)
	return l
}
