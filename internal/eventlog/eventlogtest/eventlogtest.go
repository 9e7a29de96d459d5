package eventlogtest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// key authenticates the records of the event logs Open opens.
var key = []byte("0123456789abcdef0123456789abcdef")

// Open starts an in-process nats-server with JetStream in a temporary directory, opens the
// event log on it (its default configuration, records authenticated with a fixed test key), and feeds the
// returned view from it until the test ends.
func Open(t testing.TB) (*eventlog.Log, *eventlog.View) {
	t.Helper()
	c, err := natsconn.Connect(natsconn.Config{StoreDir: t.TempDir(), Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	js, err := jetstream.New(c.NC)
	if err != nil {
		t.Fatal(err)
	}
	cfg := eventlog.DefaultConfig()
	cfg.Key = key
	l, err := eventlog.Open(t.Context(), js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := eventlog.NewView()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Watch(ctx, v) }()
	t.Cleanup(func() { cancel(); <-done })
	return l, v
}
