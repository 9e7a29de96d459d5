package eventlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

// TestWatchFailsWhenItsConsumerDeliversNothing: a starting view whose consumer delivers none
// of the records the stream holds (here the server refuses the consumer's pull requests, as a
// consumer left stuck by a partition delivers nothing) fails with ErrStalled instead of
// staying unready for good, so that the controller starts it again with a new consumer.
func TestWatchFailsWhenItsConsumerDeliversNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the stall probes (10 s)")
	}
	s := startServer(t, &server.Options{Users: []*server.User{
		{Username: "admin", Password: "pw-admin"},
		{Username: "stuck", Password: "pw-stuck", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.CONSUMER.MSG.NEXT." + eventlog.StreamAssignments + ".>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{">"}},
		}},
	}})
	// A record the live index's tail does not cover yet (no view followed the stream).
	_, err := connectAs(t, s, "admin", "pw-admin").log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: 7, Actor: "test", At: time.Now(),
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(t, err)

	v := eventlog.NewView()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stuck := connectAs(t, s, "stuck", "pw-stuck").log
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
