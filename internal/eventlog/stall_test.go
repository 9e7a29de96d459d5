package eventlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// TestWatchFailsWhenItsConsumerDeliversNothing: a starting view whose consumer delivers none
// of the records the stream holds (here the server refuses the consumer's pull requests, as a
// consumer left stuck by a partition delivers nothing) fails with ErrStalled instead of
// staying unready for good, so that the controller starts it again with a new consumer.
func TestWatchFailsWhenItsConsumerDeliversNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the stall probes (10 s)")
	}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
		Users: []*server.User{
			{Username: "admin", Password: "pw-admin"},
			{Username: "stuck", Password: "pw-stuck", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.CONSUMER.MSG.NEXT." + eventlog.StreamAssignments + ".>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{">"}},
			}},
		}}
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(s.Shutdown)
	open := func(user string) *eventlog.Log {
		c, err := natsconn.Connect(natsconn.Config{URL: s.ClientURL(), User: user, Password: "pw-" + user, Name: user})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		js, err := jetstream.New(c.NC)
		require.NoError(t, err)
		cfg := eventlog.DefaultConfig()
		cfg.Key = eventlogtest.Key
		l, err := eventlog.Open(t.Context(), js, cfg)
		require.NoError(t, err)
		return l
	}
	// A record the live index's tail does not cover yet (no view followed the stream).
	_, err = open("admin").Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: 7, Actor: "test", At: time.Now(),
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(t, err)

	v := eventlog.NewView()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stuck := open("stuck")
	errc := make(chan error, 1)
	go func() { errc <- stuck.Watch(ctx, v) }()
	select {
	case err = <-errc:
	case <-time.After(45 * time.Second):
		t.Fatal("a view whose consumer delivers nothing waits for good")
	}
	require.ErrorIs(t, err, eventlog.ErrStalled)
	select {
	case <-v.Ready():
		t.Fatal("a view that read nothing is ready")
	default:
	}
}
