package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/lease"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestOneHolderAtATime(t *testing.T) {
	_, js := eventlogtest.Connect(t)
	cfg := eventlog.DefaultConfig()
	cfg.Key, cfg.LeasesTTL = eventlogtest.Key, lease.MinTTL
	l, err := eventlog.Open(t.Context(), js, cfg)
	require.NoError(t, err)
	ctx := t.Context()

	var changes []bool
	a := lease.New(l.Leases(), "k", "a", lease.MinTTL, zerolog.Nop(), func(h bool) { changes = append(changes, h) })
	b := lease.New(l.Leases(), "k", "b", lease.MinTTL, zerolog.Nop(), nil)
	other := lease.New(l.Leases(), "other", "b", lease.MinTTL, zerolog.Nop(), nil)
	a.Renew(ctx)
	b.Renew(ctx)
	other.Renew(ctx)
	require.True(t, a.Held(), "the first holder did not take the free key")
	require.False(t, b.Held(), "a second holder took a held key")
	require.True(t, other.Held(), "a lease on another key is independent")
	a.Renew(ctx)
	require.True(t, a.Held(), "the holder lost its key on renewal")
	assert.Equal(t, []bool{true}, changes)

	_, _, held := b.Context(ctx)
	require.False(t, held, "Context says held for a replica that is not")
	c, cancel, held := a.Context(ctx)
	defer cancel()
	require.True(t, held)
	deadline, ok := c.Deadline()
	require.True(t, ok, "the holder's context has no deadline")
	assert.WithinDuration(t, time.Now().Add(lease.MinTTL), deadline, lease.MinTTL)

	// Run releases the key when it stops: the other holder takes it at its next try.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- a.Run(runCtx) }()
	stop()
	require.NoError(t, <-done)
	assert.False(t, a.Held())
	assert.Equal(t, []bool{true, false}, changes)
	b.Renew(ctx)
	require.True(t, b.Held(), "the key was not released")
}

func TestPausedHolderStopsBelieving(t *testing.T) {
	_, js := eventlogtest.Connect(t)
	cfg := eventlog.DefaultConfig()
	cfg.Key, cfg.LeasesTTL = eventlogtest.Key, lease.MinTTL
	l, err := eventlog.Open(t.Context(), js, cfg)
	require.NoError(t, err)
	clk := &clock{now: time.Now()}
	a := lease.New(l.Leases(), "k", "a", lease.MinTTL, zerolog.Nop(), nil, lease.WithClock(clk.Now))
	a.Renew(t.Context())
	require.True(t, a.Held())
	clk.Advance(lease.MinTTL - time.Millisecond)
	require.True(t, a.Held())
	clk.Advance(time.Millisecond)
	require.False(t, a.Held(), "a holder paused for its whole TTL still believes it holds the key")
	_, _, held := a.Context(t.Context())
	require.False(t, held)
}
