package podworkertest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/podworker"
)

// Ended is what a backend reported of one environment's end: what Wait would return.
type Ended struct {
	Exit podworker.Exit
	Err  error
}

// Ends registers the environment h through register (which hands its argument to a
// Notifier's Notify, or to podworker.Await); the channel delivers the end. It fails t if the
// end is reported more than once.
func Ends(t testing.TB, h podworker.Handle, register func(ended func(podworker.Exit, error))) <-chan Ended {
	ch := make(chan Ended, 1)
	var calls atomic.Int32
	register(func(exit podworker.Exit, err error) {
		if calls.Add(1) > 1 {
			t.Errorf("the end of %s was reported more than once", h.ID)
			return
		}
		ch <- Ended{exit, err}
	})
	return ch
}

// Notified registers h with n.Notify (Ends of a Notifier) until ctx ends: then it stops the
// registration with ctx's error, as the worker stops its registrations when it stops.
func Notified(t testing.TB, ctx context.Context, n podworker.Notifier, h podworker.Handle) <-chan Ended {
	return Ends(t, h, func(ended func(podworker.Exit, error)) {
		stop := n.Notify(h, ended)
		context.AfterFunc(ctx, func() { stop(ctx.Err()) })
	})
}

// Receive returns the end ch delivers, failing t when none comes within timeout.
func Receive(t testing.TB, timeout time.Duration, ch <-chan Ended, what string) Ended {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(timeout):
		t.Fatalf("%s: no end reported within %v", what, timeout)
		return Ended{}
	}
}

// RequireNoEnd fails t if ch has delivered an end: the environment still runs.
func RequireNoEnd(t testing.TB, ch <-chan Ended, what string) {
	t.Helper()
	select {
	case e := <-ch:
		t.Fatalf("%s: end %+v, %v reported of a running environment", what, e.Exit, e.Err)
	default:
	}
}
