package clock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSleepPasses(t *testing.T) {
	began := time.Now()
	require.NoError(t, Sleep(context.Background(), 20*time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(began), 20*time.Millisecond)
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	began := time.Now()
	err := Sleep(ctx, time.Hour)
	require.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(began), time.Minute, "a cancelled pause returns at once")
}
