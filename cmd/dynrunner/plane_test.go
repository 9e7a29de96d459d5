package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog"
)

func TestTransientJetStream(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{fmt.Errorf("eventlog: bucket x: %w", context.DeadlineExceeded), true},
		{nats.ErrNoResponders, true},
		{jetstream.ErrJetStreamNotEnabled, true},
		{&jetstream.APIError{Code: 503, Description: "JetStream system temporarily unavailable"}, true},
		{&jetstream.APIError{Code: 500, ErrorCode: jsErrInsufficientResources, Description: "insufficient resources"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use"}, true},
		{&jetstream.APIError{Code: 500, ErrorCode: 10074, Description: "replicas > 1 not supported in non-clustered mode"}, false},
		{errors.New("eventlog: Config.Key must be 32 bytes"), false},
		{context.Canceled, false},
	} {
		assert.Equal(t, c.want, transientJetStream(c.err), "%v", c.err)
	}
}

// TestOpenEventLogWaitsForJetStream starts a process's topology while its server has no
// JetStream yet (a cluster still forming answers the same way), then brings JetStream up at
// the same address: the open succeeds instead of failing the boot.
func TestOpenEventLogWaitsForJetStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server twice")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	start := func(js bool) *server.Server {
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: js, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
		require.NoError(t, err)
		go s.Start()
		require.True(t, s.ReadyForConnections(10*time.Second))
		return s
	}
	plain := start(false)
	nc, err := nats.Connect(plain.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	cfg := eventlog.DefaultConfig()
	cfg.Key = []byte("0123456789abcdef0123456789abcdef")
	type result struct {
		l   *eventlog.Log
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := openEventLog(t.Context(), js, cfg, zerolog.Nop())
		done <- result{l, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("opened without JetStream: %v", r.err)
	case <-time.After(time.Second): // it is still waiting: the point of the test
	}
	plain.Shutdown()
	plain.WaitForShutdown()
	defer start(true).Shutdown()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.NoError(t, r.l.Check(t.Context()))
	case <-time.After(openTopologyWithin):
		t.Fatal("openEventLog did not return once JetStream was up")
	}
}

// TestOpenEventLogFailsAtOnceOnConfiguration: an error no wait cures fails the boot at once.
func TestOpenEventLogFailsAtOnceOnConfiguration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server")
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	defer s.Shutdown()
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cfg := eventlog.DefaultConfig()
	cfg.Key = []byte("0123456789abcdef0123456789abcdef")
	cfg.Replicas = 3 // a single server cannot place three replicas
	began := time.Now()
	_, err = openEventLog(t.Context(), js, cfg, zerolog.Nop())
	require.Error(t, err)
	assert.Less(t, time.Since(began), openTopologyWithin/2, "a configuration error must not wait: %v", err)
}
