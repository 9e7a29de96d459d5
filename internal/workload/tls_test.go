package workload

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// staticSource serves one SVID and a set of bundles (to model federation).
type staticSource struct {
	svid    *x509svid.SVID
	bundles *x509bundle.Set
}

func (s staticSource) GetX509SVID() (*x509svid.SVID, error) { return s.svid, nil }
func (s staticSource) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return s.bundles.GetX509BundleForTrustDomain(td)
}
func (s staticSource) Close() error { return nil }

// startFacade serves handler with cfg on a loopback port the way the facade does
// (http.Server.ServeTLS, which also enables HTTP/2) and returns its base URL.
func startFacade(t *testing.T, cfg *tls.Config, handler http.Handler) (string, *syncBuffer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	serverLog := &syncBuffer{}
	srv := &http.Server{
		Handler:           handler,
		TLSConfig:         cfg,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          log.New(serverLog, "", 0), // refused handshakes are expected
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeTLS(ln, "", "")
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "https://" + ln.Addr().String(), serverLog
}

// syncBuffer collects the server's error log.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// peerHandler answers with the caller's assignment, as the facade authorizes it.
func peerHandler(calls *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		id, err := PeerID(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		task, epoch, err := ParseAssignmentID(id, testTD)
		if err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, "%s task=%d epoch=%d %s", id, task, epoch, r.Proto)
	})
}

func get(t *testing.T, url string, cfg *tls.Config, h2 bool) (string, error) {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: h2}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := client.Get(url + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %s: %s", resp.Status, body)
	}
	return string(body), nil
}

func mustSource(t *testing.T, ca *DevCA, id spiffeid.ID) Source {
	t.Helper()
	src, err := ca.Source(id, time.Hour)
	require.NoError(t, err)
	t.Cleanup(func() { src.Close() })
	return src
}

func TestMTLS(t *testing.T) {
	ca := newCA(t, testTD)
	rogueCA := newCA(t, testTD) // same trust domain name, different key
	otherCA := newCA(t, otherTD)
	assignmentID := AssignmentID(testTD, 42, 7)
	facade, err := ca.ServerSource(FacadeID(testTD), time.Hour, LocalHosts())
	require.NoError(t, err)
	defer facade.Close()

	federated := func(t *testing.T) Source {
		svid, err := ca.IssueServer(FacadeID(testTD), time.Hour, LocalHosts())
		require.NoError(t, err)
		return staticSource{svid: svid, bundles: x509bundle.NewSet(ca.Bundle(), otherCA.Bundle())}
	}
	otherTDClient := func(t *testing.T) *tls.Config {
		svid, err := otherCA.Issue(AssignmentID(otherTD, 42, 7), time.Hour)
		require.NoError(t, err)
		src := staticSource{svid: svid, bundles: x509bundle.NewSet(ca.Bundle(), otherCA.Bundle())}
		return ClientTLSConfig(src, FacadeID(testTD))
	}

	tests := []struct {
		name     string
		server   func(t *testing.T) Source
		client   func(t *testing.T) *tls.Config
		h2       bool
		wantBody string // "": the request must fail before the handler runs
	}{
		{
			name: "assignment over http2",
			client: func(t *testing.T) *tls.Config {
				return ClientTLSConfig(mustSource(t, ca, assignmentID), FacadeID(testTD))
			},
			h2:       true,
			wantBody: "spiffe://ci.example.org/dynrunner/task/42/epoch/7 task=42 epoch=7 HTTP/2.0",
		},
		{
			name: "assignment over http1.1",
			client: func(t *testing.T) *tls.Config {
				return ClientTLSConfig(mustSource(t, ca, assignmentID), FacadeID(testTD))
			},
			wantBody: "spiffe://ci.example.org/dynrunner/task/42/epoch/7 task=42 epoch=7 HTTP/1.1",
		},
		{
			name: "ordinary tls client trusting the ca by host name",
			client: func(t *testing.T) *tls.Config {
				svid, err := ca.Issue(assignmentID, time.Hour)
				require.NoError(t, err)
				roots := x509.NewCertPool()
				roots.AddCert(ca.Certificate())
				return &tls.Config{
					RootCAs: roots,
					Certificates: []tls.Certificate{{
						Certificate: [][]byte{svid.Certificates[0].Raw},
						PrivateKey:  svid.PrivateKey,
					}},
					MinVersion: tls.VersionTLS12,
				}
			},
			wantBody: "spiffe://ci.example.org/dynrunner/task/42/epoch/7 task=42 epoch=7 HTTP/1.1",
		},
		{
			name:   "client with an svid of another ca",
			client: func(t *testing.T) *tls.Config { return clientTrustingCA(t, rogueCA, assignmentID, ca) },
			h2:     true,
		},
		{
			name: "client without a certificate",
			client: func(t *testing.T) *tls.Config {
				return tlsconfig.TLSClientConfig(ca.Bundle(), tlsconfig.AuthorizeID(FacadeID(testTD)))
			},
		},
		{
			name:   "client of another trust domain",
			client: otherTDClient,
		},
		{
			name:   "client of a federated trust domain",
			server: federated,
			client: otherTDClient,
		},
		{
			name: "server with another identity than the facade",
			server: func(t *testing.T) Source {
				return mustSource(t, ca, AssignmentID(testTD, 1, 1))
			},
			client: func(t *testing.T) *tls.Config {
				return ClientTLSConfig(mustSource(t, ca, assignmentID), FacadeID(testTD))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server := facade
			if tt.server != nil {
				server = tt.server(t)
			}
			var calls atomic.Int32
			url, serverLog := startFacade(t, ServerTLSConfig(server), peerHandler(&calls))
			body, err := get(t, url, tt.client(t), tt.h2)
			if tt.wantBody == "" {
				require.Error(t, err, "request succeeded with %q, want a refused handshake", body)
				t.Logf("refused as expected: client: %v", err)
				t.Logf("refused as expected: server log: %s", serverLog)
				assert.EqualValues(t, 0, calls.Load(), "handler ran %d times, want 0", calls.Load())
				return
			}
			require.NoError(t, err, "request failed")
			assert.Equal(t, tt.wantBody, body, "body")
		})
	}
}

// clientTrustingCA presents an SVID of ca for id but trusts trusted's bundle for the
// server, so that only the server's check of the client can fail.
func clientTrustingCA(t *testing.T, ca *DevCA, id spiffeid.ID, trusted *DevCA) *tls.Config {
	t.Helper()
	svid, err := ca.Issue(id, time.Hour)
	require.NoError(t, err)
	return ClientTLSConfig(staticSource{svid: svid, bundles: x509bundle.NewSet(trusted.Bundle())}, FacadeID(testTD))
}

func TestAuthorizeOwnTrustDomain(t *testing.T) {
	ca := newCA(t, testTD)
	authorize := authorizeOwnTrustDomain(mustSource(t, ca, FacadeID(testTD)))
	tests := []struct {
		name    string
		id      spiffeid.ID
		wantErr bool
	}{
		{name: "member", id: AssignmentID(testTD, 1, 1)},
		{name: "other trust domain", id: AssignmentID(otherTD, 1, 1), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := authorize(tt.id, nil)
			if tt.wantErr {
				require.Error(t, err, "authorize(%s)", tt.id)
			} else {
				require.NoError(t, err, "authorize(%s)", tt.id)
			}
		})
	}
	closed := mustSource(t, ca, FacadeID(testTD))
	closed.Close()
	err := authorizeOwnTrustDomain(closed)(AssignmentID(testTD, 1, 1), nil)
	assert.ErrorIs(t, err, ErrClosed, "authorize with a closed source error")
}

func TestServerTLSConfig(t *testing.T) {
	ca := newCA(t, testTD)
	cfg := ServerTLSConfig(mustSource(t, ca, FacadeID(testTD)))
	assert.Equal(t, tls.RequireAnyClientCert, cfg.ClientAuth, "ClientAuth, want client SVIDs required")
	assert.NotNil(t, cfg.VerifyPeerCertificate, "VerifyPeerCertificate not set, want client SVIDs verified")
	assert.EqualValues(t, "h2,http/1.1", strings.Join(cfg.NextProtos, ","), "NextProtos = %s, want h2,http/1.1", strings.Join(cfg.NextProtos, ","))
	assert.GreaterOrEqual(t, cfg.MinVersion, uint16(tls.VersionTLS12), "MinVersion = %x, want at least TLS 1.2", cfg.MinVersion)
}

func TestPeerID(t *testing.T) {
	ca := newCA(t, testTD)
	svid, err := ca.Issue(AssignmentID(testTD, 42, 7), time.Hour)
	require.NoError(t, err)
	leaf := svid.Certificates[0]
	plain := plainCert(t)

	tests := []struct {
		name    string
		state   *tls.ConnectionState
		want    string
		wantErr error
	}{
		{name: "verified chain", state: &tls.ConnectionState{HandshakeComplete: true, VerifiedChains: [][]*x509.Certificate{{leaf, ca.Certificate()}}}, want: svid.ID.String()},
		{name: "peer certificates", state: &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{leaf}}, want: svid.ID.String()},
		{name: "plain http", state: nil, wantErr: ErrNoPeerID},
		{name: "handshake incomplete", state: &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}, wantErr: ErrNoPeerID},
		{name: "no client certificate", state: &tls.ConnectionState{HandshakeComplete: true}, wantErr: ErrNoPeerID},
		{name: "certificate without spiffe id", state: &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{plain}}, wantErr: ErrNoPeerID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &http.Request{TLS: tt.state}
			got, err := PeerID(r)
			require.ErrorIs(t, err, tt.wantErr, "PeerID()")
			if tt.wantErr == nil {
				assert.Equal(t, tt.want, got.String(), "PeerID()")
			}
		})
	}
}

// plainCert returns a self-signed certificate without a URI SAN.
func plainCert(t *testing.T) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     []string{"example.org"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}
