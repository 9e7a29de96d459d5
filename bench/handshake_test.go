package bench

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/workload"
)

// BenchmarkHandshake is the floor under BenchmarkLifecycles' CPU per lifecycle: one mTLS
// handshake of an environment with the facade, both sides, as the plane makes one per
// environment (ServerTLSConfig against ClientTLSConfig, SVIDs of the development CA, TLS
// 1.3 with Go's default key exchange X25519MLKEM768), over loopback TCP. Each environment presents an SVID of its own; issuing it is in
// BenchmarkIssueSVID, not here.
func BenchmarkHandshake(b *testing.B) {
	ca, err := workload.LoadOrCreateDevCA(b.TempDir(), benchTD)
	require.NoError(b, err)
	srvSrc, err := ca.ServerSource(workload.FacadeID(benchTD), time.Hour, workload.LocalHosts())
	require.NoError(b, err)
	cliSrc, err := ca.Source(workload.AssignmentID(benchTD, 1, 1), time.Hour)
	require.NoError(b, err)
	srvCfg := workload.ServerTLSConfig(srvSrc)
	cliCfg := workload.ClientTLSConfig(cliSrc, workload.FacadeID(benchTD))
	cliCfg.NextProtos = []string{"h2"} // as the environments' HTTP/2 transport offers
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer func() { _ = ln.Close() }()
	ctx := context.Background()
	cpu0 := cpuTime()
	for b.Loop() {
		done := make(chan error, 1)
		var sc *tls.Conn
		go func() {
			s, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			sc = tls.Server(s, srvCfg)
			done <- sc.HandshakeContext(ctx)
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(b, err)
		cc := tls.Client(c, cliCfg)
		require.NoError(b, cc.HandshakeContext(ctx))
		require.NoError(b, <-done)
		require.Equal(b, "h2", cc.ConnectionState().NegotiatedProtocol)
		_ = cc.Close()
		_ = sc.Close()
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N)/1000, "cpu-ms/handshake")
}

// BenchmarkIssueSVID is the development CA issuing one environment's SVID and encoding its
// files, as the pod worker does for each environment of BenchmarkLifecycles (SPIRE's work in
// production).
func BenchmarkIssueSVID(b *testing.B) {
	ca, err := workload.LoadOrCreateDevCA(b.TempDir(), benchTD)
	require.NoError(b, err)
	id := devIdentity{ca}
	cpu0 := cpuTime()
	for b.Loop() {
		_, err := id.Files(1, 1, time.Now().Add(time.Hour))
		require.NoError(b, err)
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N)/1000, "cpu-ms/svid")
}
