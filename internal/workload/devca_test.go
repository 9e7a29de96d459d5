package workload

import (
	"crypto/ecdsa"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/secretfile"
)

func newCA(t *testing.T, td spiffeid.TrustDomain) *DevCA {
	t.Helper()
	ca, err := LoadOrCreateDevCA(filepath.Join(t.TempDir(), "devca"), td)
	require.NoError(t, err, "LoadOrCreateDevCA()")
	return ca
}

func TestLoadOrCreateDevCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "devca")
	ca, err := LoadOrCreateDevCA(dir, testTD)
	require.NoError(t, err, "LoadOrCreateDevCA()")
	cert := ca.Certificate()
	assert.True(t, cert.IsCA && cert.KeyUsage&x509.KeyUsageCertSign != 0, "CA certificate: IsCA = %v, KeyUsage = %v", cert.IsCA, cert.KeyUsage)
	if assert.Len(t, cert.URIs, 1, "CA URIs") {
		assert.Equal(t, "spiffe://ci.example.org", cert.URIs[0].String(), "CA URI")
	}
	assert.InDelta(t, 365*24*time.Hour, cert.NotAfter.Sub(cert.NotBefore), float64(24*time.Hour), "CA validity, want about a year")
	assert.Equal(t, testTD, ca.TrustDomain(), "TrustDomain()")

	di, err := os.Stat(dir)
	require.NoError(t, err)
	assert.EqualValues(t, 0o700, di.Mode().Perm(), "dir mode = %04o, want 0700", di.Mode().Perm())
	for _, name := range []string{DevCACertFile, DevCAKeyFile} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.EqualValues(t, 0o600, fi.Mode().Perm(), "%s mode = %04o, want 0600", name, fi.Mode().Perm())
	}

	again, err := LoadOrCreateDevCA(dir, testTD)
	require.NoError(t, err, "LoadOrCreateDevCA() again")
	assert.True(t, again.Certificate().Equal(cert), "LoadOrCreateDevCA() did not reuse the CA kept in dir")
	// SVIDs of the first instance verify against the reloaded one's bundle.
	svid, err := ca.Issue(AssignmentID(testTD, 1, 1), time.Hour)
	require.NoError(t, err)
	_, _, err = x509svid.Verify(svid.Certificates, again.Bundle())
	assert.NoError(t, err, "SVID of the first instance does not verify with the reloaded CA")
}

func TestLoadOrCreateDevCAErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string)
		td      spiffeid.TrustDomain
		wantErr error // nil: any error
		wantMsg string
	}{
		{
			name:    "other trust domain",
			setup:   func(t *testing.T, dir string) { mustDevCA(t, dir, otherTD) },
			td:      testTD,
			wantMsg: "remove",
		},
		{
			name: "world readable key",
			setup: func(t *testing.T, dir string) {
				mustDevCA(t, dir, testTD)
				require.NoError(t, os.Chmod(filepath.Join(dir, DevCAKeyFile), 0o644))
			},
			td:      testTD,
			wantErr: secretfile.ErrPermissions,
		},
		{
			name: "key missing",
			setup: func(t *testing.T, dir string) {
				mustDevCA(t, dir, testTD)
				require.NoError(t, os.Remove(filepath.Join(dir, DevCAKeyFile)))
			},
			td:      testTD,
			wantMsg: "remove",
		},
		{
			name: "key of another CA",
			setup: func(t *testing.T, dir string) {
				mustDevCA(t, dir, testTD)
				other := filepath.Join(t.TempDir(), "other")
				mustDevCA(t, other, testTD)
				key, err := os.ReadFile(filepath.Join(other, DevCAKeyFile))
				require.NoError(t, err)
				require.NoError(t, secretfile.WriteNew(filepath.Join(dir, DevCAKeyFile), key))
			},
			td:      testTD,
			wantMsg: "does not match",
		},
		{
			name: "garbage certificate",
			setup: func(t *testing.T, dir string) {
				require.NoError(t, secretfile.WriteNew(filepath.Join(dir, DevCACertFile), []byte("nope")))
			},
			td: testTD,
		},
		{
			name:  "zero trust domain",
			setup: func(t *testing.T, dir string) {},
			td:    spiffeid.TrustDomain{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "devca")
			tt.setup(t, dir)
			_, err := LoadOrCreateDevCA(dir, tt.td)
			require.Error(t, err, "LoadOrCreateDevCA() succeeded, want an error")
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr, "LoadOrCreateDevCA() error")
			}
			// Messages are for operators; check only that they say what to do.
			if tt.wantMsg != "" {
				assert.ErrorContains(t, err, tt.wantMsg, "error does not say what to do")
			}
			assert.True(t, strings.HasPrefix(err.Error(), "workload: "), "error %q lacks the package prefix", err)
		})
	}
}

func mustDevCA(t *testing.T, dir string, td spiffeid.TrustDomain) *DevCA {
	t.Helper()
	ca, err := LoadOrCreateDevCA(dir, td)
	require.NoError(t, err)
	return ca
}

func TestDevCARenewsBeforeExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "devca")
		first := mustDevCA(t, dir, testTD)
		time.Sleep(300 * 24 * time.Hour)
		assert.True(t, mustDevCA(t, dir, testTD).Certificate().Equal(first.Certificate()), "CA replaced with 65 days left, want it reused")
		time.Sleep(40 * 24 * time.Hour)
		second := mustDevCA(t, dir, testTD)
		require.False(t, second.Certificate().Equal(first.Certificate()), "CA kept with 25 days left, want it replaced")
		assert.True(t, mustDevCA(t, dir, testTD).Certificate().Equal(second.Certificate()), "replacement CA not kept in dir")
	})
}

func TestDevCAIssue(t *testing.T) {
	ca := newCA(t, testTD)
	tests := []struct {
		name      string
		id        spiffeid.ID
		ttl       time.Duration
		hosts     []string
		wantDNS   []string
		wantIPs   []string
		wantError bool
	}{
		{name: "assignment", id: AssignmentID(testTD, 42, 7), ttl: time.Hour},
		{name: "facade with local hosts", id: FacadeID(testTD), ttl: time.Hour, hosts: LocalHosts(),
			wantDNS: []string{"localhost"}, wantIPs: []string{"127.0.0.1", "::1"}},
		{name: "ttl beyond the CA is cut", id: FacadeID(testTD), ttl: 10 * 365 * 24 * time.Hour},
		{name: "other trust domain", id: AssignmentID(otherTD, 42, 7), ttl: time.Hour, wantError: true},
		{name: "trust domain id", id: testTD.ID(), ttl: time.Hour, wantError: true},
		{name: "zero id", id: spiffeid.ID{}, ttl: time.Hour, wantError: true},
		{name: "zero ttl", id: FacadeID(testTD), ttl: 0, wantError: true},
		{name: "empty host", id: FacadeID(testTD), ttl: time.Hour, hosts: []string{""}, wantError: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svid, err := ca.IssueServer(tt.id, tt.ttl, tt.hosts)
			if tt.wantError {
				require.Error(t, err, "IssueServer() succeeded, want an error")
				return
			}
			require.NoError(t, err, "IssueServer()")
			assert.Equal(t, tt.id, svid.ID, "ID")
			// The SVID is valid by the SPIFFE rules and chains to the bundle.
			id, _, err := x509svid.Verify(svid.Certificates, ca.Bundle())
			require.NoError(t, err, "x509svid.Verify()")
			assert.Equal(t, tt.id, id, "verified ID")
			certPEM, keyPEM, err := svid.Marshal()
			require.NoError(t, err)
			_, err = x509svid.Parse(certPEM, keyPEM)
			assert.NoError(t, err, "x509svid.Parse()")
			leaf := svid.Certificates[0]
			assert.Subset(t, leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}, "ExtKeyUsage, want client and server auth")
			assert.False(t, leaf.NotAfter.After(ca.Certificate().NotAfter), "leaf expires %s, after the CA %s", leaf.NotAfter, ca.Certificate().NotAfter)
			assert.Equal(t, tt.wantDNS, leaf.DNSNames, "DNSNames")
			var ips []string
			for _, ip := range leaf.IPAddresses {
				ips = append(ips, ip.String())
			}
			assert.Equal(t, tt.wantIPs, ips, "IPAddresses")
			// An ordinary TLS client that trusts the CA accepts the host names.
			for _, h := range tt.hosts {
				roots := x509.NewCertPool()
				roots.AddCert(ca.Certificate())
				_, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots})
				assert.NoError(t, err, "leaf does not verify for host %s", h)
			}
		})
	}
}

func TestDevCAIssueDistinctKeys(t *testing.T) {
	ca := newCA(t, testTD)
	a, err := ca.Issue(FacadeID(testTD), time.Hour)
	require.NoError(t, err)
	b, err := ca.Issue(FacadeID(testTD), time.Hour)
	require.NoError(t, err)
	assert.NotZero(t, a.Certificates[0].SerialNumber.Cmp(b.Certificates[0].SerialNumber), "two SVIDs share a serial number")
	assert.False(t, a.Certificates[0].PublicKey.(*ecdsa.PublicKey).Equal(b.Certificates[0].PublicKey), "two SVIDs share a key")
}

func TestDevCASourceRotates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := mustDevCA(t, filepath.Join(t.TempDir(), "devca"), testTD)
		id := AssignmentID(testTD, 42, 7)
		src, err := ca.Source(id, time.Hour)
		require.NoError(t, err, "Source()")
		first, err := src.GetX509SVID()
		require.NoError(t, err)
		time.Sleep(29 * time.Minute)
		got, _ := src.GetX509SVID()
		assert.Same(t, first, got, "SVID re-issued before half its ttl")
		time.Sleep(2 * time.Minute)
		second, err := src.GetX509SVID()
		require.NoError(t, err)
		require.NotSame(t, first, second, "SVID not re-issued after half its ttl")
		assert.Equal(t, id, second.ID, "re-issued ID")
		assert.True(t, second.Certificates[0].NotAfter.After(first.Certificates[0].NotAfter), "re-issued SVID does not live longer than the first")
		bundle, err := src.GetX509BundleForTrustDomain(testTD)
		if assert.NoError(t, err, "GetX509BundleForTrustDomain()") {
			assert.True(t, bundle.Equal(ca.Bundle()), "GetX509BundleForTrustDomain() = %v; want the CA bundle", bundle)
		}
		_, err = src.GetX509BundleForTrustDomain(otherTD)
		assert.Error(t, err, "GetX509BundleForTrustDomain(other) succeeded")
		require.NoError(t, src.Close())
		assert.NoError(t, src.Close(), "second Close()")
		_, err = src.GetX509SVID()
		assert.ErrorIs(t, err, ErrClosed, "GetX509SVID() after Close")
	})
}

func TestDevCAServerSource(t *testing.T) {
	ca := newCA(t, testTD)
	src, err := ca.ServerSource(FacadeID(testTD), time.Hour, []string{"127.0.0.1", "facade.internal"})
	require.NoError(t, err)
	defer src.Close()
	svid, err := src.GetX509SVID()
	require.NoError(t, err)
	leaf := svid.Certificates[0]
	assert.Equal(t, []string{"facade.internal"}, leaf.DNSNames, "DNS SANs, want facade.internal")
	if assert.Len(t, leaf.IPAddresses, 1, "IP SANs, want 127.0.0.1") {
		assert.True(t, leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)), "IP SAN = %v, want 127.0.0.1", leaf.IPAddresses[0])
	}
	_, err = ca.Source(AssignmentID(otherTD, 1, 1), time.Hour)
	assert.Error(t, err, "Source() for another trust domain succeeded")
}

func mustID(t *testing.T, s string) spiffeid.ID {
	t.Helper()
	id, err := spiffeid.FromString(s)
	require.NoError(t, err)
	return id
}
