// Package clock holds the one cancellable pause every retry loop of dynrunner waits with.
package clock

import (
	"context"
	"time"
)

// Sleep pauses for d or until ctx is done, whichever comes first, and returns ctx's error
// (nil when the whole pause passed).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
