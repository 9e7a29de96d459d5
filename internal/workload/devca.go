package workload

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// Files of a DevCA directory.
const (
	DevCACertFile = "ca.pem"     // the CA certificate, PEM, mode 0600
	DevCAKeyFile  = "ca_key.pem" // the CA's private key, PKCS#8 PEM, mode 0600
)

const (
	devCAValidity = 365 * 24 * time.Hour
	// devCARenewBefore is how long before its expiry a DevCA is replaced on load.
	devCARenewBefore = 30 * 24 * time.Hour
	// backdate covers clock skew between the issuer and the verifier.
	backdate = time.Minute
)

// DevCA is the development-only certificate authority of one trust domain. It is safe for
// concurrent use. See the package documentation.
type DevCA struct {
	td   spiffeid.TrustDomain
	cert *x509.Certificate
	key  crypto.Signer
}

// LoadOrCreateDevCA loads the CA of trust domain td kept in dir, or creates it there if
// dir holds none, or replaces it if it expires within 30 days. A CA kept for another trust
// domain is an error: remove dir to start over.
func LoadOrCreateDevCA(dir string, td spiffeid.TrustDomain) (*DevCA, error) {
	if td.IsZero() {
		return nil, errors.New("workload: dev ca: no trust domain")
	}
	ca, err := loadDevCA(dir, td)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return createDevCA(dir, td)
	case err != nil:
		return nil, err
	case time.Until(ca.cert.NotAfter) < devCARenewBefore:
		return createDevCA(dir, td)
	default:
		return ca, nil
	}
}

func loadDevCA(dir string, td spiffeid.TrustDomain) (*DevCA, error) {
	certPath, keyPath := filepath.Join(dir, DevCACertFile), filepath.Join(dir, DevCAKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		// A missing certificate means no CA yet (the key is written first).
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("workload: dev ca: %s holds no PEM certificate", certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: %s: %w", certPath, err)
	}
	if !cert.IsCA || len(cert.URIs) != 1 || cert.URIs[0].String() != td.IDString() {
		return nil, fmt.Errorf("workload: dev ca: %s is not a CA of trust domain %q; remove %s to create a new one", certPath, td.Name(), dir)
	}
	keyPEM, err := secretfile.Read(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("workload: dev ca: %s exists but %s does not; remove %s to create a new CA", certPath, keyPath, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	defer clear(keyPEM)
	block, _ = pem.Decode(keyPEM)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("workload: dev ca: %s holds no PKCS#8 PEM private key", keyPath)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: %s: parse private key failed", keyPath)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("workload: dev ca: %s does not match %s; remove %s to create a new CA", keyPath, certPath, dir)
	}
	return &DevCA{td: td, cert: cert, key: key}, nil
}

func createDevCA(dir string, td spiffeid.TrustDomain) (*DevCA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{Organization: []string{"dynrunner"}, CommonName: "dynrunner development CA " + td.Name()},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(devCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		URIs:                  []*url.URL{td.ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	defer clear(keyPEM)
	clear(keyDER)
	// Key first: a certificate on disk always has its key.
	if err := secretfile.WriteNew(filepath.Join(dir, DevCAKeyFile), keyPEM); err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := secretfile.WriteNew(filepath.Join(dir, DevCACertFile), certPEM); err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	return &DevCA{td: td, cert: cert, key: key}, nil
}

func serialNumber() *big.Int {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails.
	b[0] &= 0x7f        // positive
	b[0] |= 0x40        // and 16 bytes long
	return new(big.Int).SetBytes(b)
}

// TrustDomain returns the CA's trust domain.
func (ca *DevCA) TrustDomain() spiffeid.TrustDomain { return ca.td }

// Certificate returns the CA certificate.
func (ca *DevCA) Certificate() *x509.Certificate { return ca.cert }

// Bundle returns a new X.509 bundle of the CA's trust domain holding the CA certificate.
func (ca *DevCA) Bundle() *x509bundle.Bundle {
	return x509bundle.FromX509Authorities(ca.td, []*x509.Certificate{ca.cert})
}

// Issue returns a new X.509-SVID for id, a member of the CA's trust domain, valid for ttl
// (cut at the CA's expiry), with a fresh ECDSA P-256 key. It is usable for TLS client and
// server authentication.
func (ca *DevCA) Issue(id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, error) {
	return ca.issue(id, ttl, nil)
}

// IssueServer is Issue with DNS names and IP addresses from hosts added to the
// certificate, so that ordinary TLS clients, which check the host name against the CA
// certificate, can dial the server too. LocalHosts lists the loopback names.
func (ca *DevCA) IssueServer(id spiffeid.ID, ttl time.Duration, hosts []string) (*x509svid.SVID, error) {
	return ca.issue(id, ttl, hosts)
}

// LocalHosts returns the host names of the loopback interface: localhost, 127.0.0.1 and ::1.
func LocalHosts() []string { return []string{"localhost", "127.0.0.1", "::1"} }

func (ca *DevCA) issue(id spiffeid.ID, ttl time.Duration, hosts []string) (*x509svid.SVID, error) {
	if id.IsZero() || !id.MemberOf(ca.td) || id.Path() == "" {
		return nil, fmt.Errorf("workload: dev ca: cannot issue %q: not a workload of trust domain %q", id.String(), ca.td.Name())
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("workload: dev ca: issue %s: ttl %s is not positive", id, ttl)
	}
	now := time.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("workload: dev ca: issue %s: the CA expired at %s", id, ca.cert.NotAfter.Format(time.RFC3339))
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{Organization: []string{"dynrunner"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{id.URL()},
	}
	for _, h := range hosts {
		switch ip := net.ParseIP(h); {
		case ip != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		case h != "":
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		default:
			return nil, fmt.Errorf("workload: dev ca: issue %s: empty host name", id)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: %w", err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: issue %s: %w", id, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("workload: dev ca: issue %s: %w", id, err)
	}
	return &x509svid.SVID{ID: id, Certificates: []*x509.Certificate{cert}, PrivateKey: key}, nil
}

// Source returns a Source for id whose SVIDs the CA issues with ttl, re-issuing when half
// of the ttl has passed, so that an SVID in use never expires. Its bundle is the CA's.
func (ca *DevCA) Source(id spiffeid.ID, ttl time.Duration) (Source, error) {
	return ca.newSource(id, ttl, nil)
}

// ServerSource is Source with IssueServer's host names in every SVID.
func (ca *DevCA) ServerSource(id spiffeid.ID, ttl time.Duration, hosts []string) (Source, error) {
	return ca.newSource(id, ttl, hosts)
}

func (ca *DevCA) newSource(id spiffeid.ID, ttl time.Duration, hosts []string) (Source, error) {
	s := &devSource{ca: ca, id: id, ttl: ttl, hosts: append([]string(nil), hosts...), bundle: ca.Bundle()}
	if err := s.refresh(time.Now()); err != nil {
		return nil, err
	}
	return s, nil
}

type devSource struct {
	ca     *DevCA
	id     spiffeid.ID
	ttl    time.Duration
	hosts  []string
	bundle *x509bundle.Bundle

	closable
	svid    *x509svid.SVID
	renewAt time.Time
}

func (s *devSource) refresh(now time.Time) error {
	svid, err := s.ca.issue(s.id, s.ttl, s.hosts)
	if err != nil {
		return err
	}
	leaf := svid.Certificates[0]
	s.svid = svid
	s.renewAt = now.Add(leaf.NotAfter.Sub(now) / 2)
	return nil
}

// GetX509SVID implements x509svid.Source.
func (s *devSource) GetX509SVID() (*x509svid.SVID, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if now := time.Now(); !now.Before(s.renewAt) {
		if err := s.refresh(now); err != nil && !now.Before(s.svid.Certificates[0].NotAfter) {
			return nil, err
		}
	}
	return s.svid, nil
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (s *devSource) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.bundle.GetX509BundleForTrustDomain(td)
}
