package workload

import (
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
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
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA certificate: IsCA = %v, KeyUsage = %v", cert.IsCA, cert.KeyUsage)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != "spiffe://ci.example.org" {
		t.Errorf("CA URIs = %v, want [spiffe://ci.example.org]", cert.URIs)
	}
	if got := cert.NotAfter.Sub(cert.NotBefore); got < 364*24*time.Hour || got > 366*24*time.Hour {
		t.Errorf("CA validity = %s, want about a year", got)
	}
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
	if !again.Certificate().Equal(cert) {
		t.Error("LoadOrCreateDevCA() did not reuse the CA kept in dir")
	}
	// SVIDs of the first instance verify against the reloaded one's bundle.
	svid, err := ca.Issue(AssignmentID(testTD, 1, 1), time.Hour)
	require.NoError(t, err)
	if _, _, err := x509svid.Verify(svid.Certificates, again.Bundle()); err != nil {
		t.Errorf("SVID of the first instance does not verify with the reloaded CA: %v", err)
	}
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
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("LoadOrCreateDevCA() error = %v, want %v", err, tt.wantErr)
			}
			// Messages are for operators; check only that they say what to do.
			if tt.wantMsg != "" && !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "workload: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
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
		if got := mustDevCA(t, dir, testTD); !got.Certificate().Equal(first.Certificate()) {
			t.Error("CA replaced with 65 days left, want it reused")
		}
		time.Sleep(40 * 24 * time.Hour)
		second := mustDevCA(t, dir, testTD)
		if second.Certificate().Equal(first.Certificate()) {
			t.Fatal("CA kept with 25 days left, want it replaced")
		}
		if got := mustDevCA(t, dir, testTD); !got.Certificate().Equal(second.Certificate()) {
			t.Error("replacement CA not kept in dir")
		}
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
			if _, err := x509svid.Parse(certPEM, keyPEM); err != nil {
				t.Errorf("x509svid.Parse() error = %v", err)
			}
			leaf := svid.Certificates[0]
			if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
				t.Errorf("ExtKeyUsage = %v, want client and server auth", leaf.ExtKeyUsage)
			}
			if leaf.NotAfter.After(ca.Certificate().NotAfter) {
				t.Errorf("leaf expires %s, after the CA %s", leaf.NotAfter, ca.Certificate().NotAfter)
			}
			if !slices.Equal(leaf.DNSNames, tt.wantDNS) {
				t.Errorf("DNSNames = %v, want %v", leaf.DNSNames, tt.wantDNS)
			}
			var ips []string
			for _, ip := range leaf.IPAddresses {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tt.wantIPs) {
				t.Errorf("IPAddresses = %v, want %v", ips, tt.wantIPs)
			}
			// An ordinary TLS client that trusts the CA accepts the host names.
			for _, h := range tt.hosts {
				roots := x509.NewCertPool()
				roots.AddCert(ca.Certificate())
				if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots}); err != nil {
					t.Errorf("leaf does not verify for host %s: %v", h, err)
				}
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
	if a.Certificates[0].SerialNumber.Cmp(b.Certificates[0].SerialNumber) == 0 {
		t.Error("two SVIDs share a serial number")
	}
	if a.Certificates[0].PublicKey.(*ecdsa.PublicKey).Equal(b.Certificates[0].PublicKey) {
		t.Error("two SVIDs share a key")
	}
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
		if got, _ := src.GetX509SVID(); got != first {
			t.Error("SVID re-issued before half its ttl")
		}
		time.Sleep(2 * time.Minute)
		second, err := src.GetX509SVID()
		require.NoError(t, err)
		if second == first {
			t.Fatal("SVID not re-issued after half its ttl")
		}
		assert.Equal(t, id, second.ID, "re-issued ID")
		if !second.Certificates[0].NotAfter.After(first.Certificates[0].NotAfter) {
			t.Error("re-issued SVID does not live longer than the first")
		}
		bundle, err := src.GetX509BundleForTrustDomain(testTD)
		if err != nil || !bundle.Equal(ca.Bundle()) {
			t.Errorf("GetX509BundleForTrustDomain() = %v, %v; want the CA bundle", bundle, err)
		}
		if _, err := src.GetX509BundleForTrustDomain(otherTD); err == nil {
			t.Error("GetX509BundleForTrustDomain(other) succeeded")
		}
		require.NoError(t, src.Close())
		assert.NoError(t, src.Close(), "second Close()")
		if _, err := src.GetX509SVID(); !errors.Is(err, ErrClosed) {
			t.Errorf("GetX509SVID() after Close error = %v, want ErrClosed", err)
		}
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
	if !slices.Equal(leaf.DNSNames, []string{"facade.internal"}) || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("SANs = %v %v, want facade.internal and 127.0.0.1", leaf.DNSNames, leaf.IPAddresses)
	}
	if _, err := ca.Source(AssignmentID(otherTD, 1, 1), time.Hour); err == nil {
		t.Error("Source() for another trust domain succeeded")
	}
}

func mustID(t *testing.T, s string) spiffeid.ID {
	t.Helper()
	id, err := spiffeid.FromString(s)
	require.NoError(t, err)
	return id
}
