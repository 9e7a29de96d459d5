package eventlogtest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// Key authenticates the records of the event logs Open opens; tests that open their own
// use it too.
var Key = []byte("0123456789abcdef0123456789abcdef")

// Connect starts an in-process nats-server with JetStream in a temporary directory, closed
// when the test ends, and returns the connection and its JetStream.
func Connect(t testing.TB) (*natsconn.Conn, jetstream.JetStream) {
	t.Helper()
	c, err := natsconn.Connect(natsconn.Config{StoreDir: t.TempDir(), Name: t.Name()})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	js, err := jetstream.New(c.NC)
	require.NoError(t, err)
	return c, js
}

// Open starts an in-process nats-server with JetStream in a temporary directory, opens the
// event log on it (its default configuration, records authenticated with a fixed test key), and feeds the
// returned view from it until the test ends.
func Open(t testing.TB) (*eventlog.Log, *eventlog.View) {
	t.Helper()
	l, v, _ := OpenJetStream(t)
	return l, v
}

// OpenJetStream is Open, and also returns the JetStream handle the log was opened on, for
// tests that write around the log (a forged record, a deleted stream).
func OpenJetStream(t testing.TB) (*eventlog.Log, *eventlog.View, jetstream.JetStream) {
	t.Helper()
	_, js := Connect(t)
	cfg := eventlog.DefaultConfig()
	cfg.Key = Key
	l, err := eventlog.Open(t.Context(), js, cfg)
	require.NoError(t, err)
	v := eventlog.NewView()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Watch(ctx, v) }()
	t.Cleanup(func() { cancel(); <-done })
	return l, v, js
}
