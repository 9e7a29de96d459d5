package natsconn

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// blackHole forwards TCP to target until cut, then drops every byte both ways without closing
// anything: what a network partition does to an open connection.
type blackHole struct {
	ln  net.Listener
	cut atomic.Bool
	mu  sync.Mutex
	all []net.Conn
}

func newBlackHole(t *testing.T, target string) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &blackHole{ln: ln}
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.all {
			_ = c.Close()
		}
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			b.mu.Lock()
			b.all = append(b.all, in, out)
			b.mu.Unlock()
			go b.pipe(in, out)
			go b.pipe(out, in)
		}
	}()
	return b
}

func (b *blackHole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if b.cut.Load() {
			continue // dropped, the connection left open
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestExternalConnectionNoticesAPartition: a server that stops answering without closing the
// connection is given up within seconds (the keepalive), not after nats.go's default of four
// minutes, during which every JetStream request would time out.
func TestExternalConnectionNoticesAPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the keepalive")
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(s.Shutdown)
	hole := newBlackHole(t, s.Addr().String())

	c, err := Connect(Config{URL: "nats://" + hole.ln.Addr().String(), Name: "partition-test"})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.NoError(t, c.NC.Flush())

	hole.cut.Store(true)
	limit := 3 * externalPingInterval * externalMaxPingsOut
	require.Eventually(t, func() bool { return c.NC.Status() != nats.CONNECTED }, limit, 100*time.Millisecond,
		"the connection still counts as connected %s after the partition", limit)
}
