package workload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// ErrNoPeerID reports a request without a verified client SVID.
var ErrNoPeerID = errors.New("no client spiffe id")

// ServerTLSConfig returns the facade's mTLS configuration: it presents src's current SVID
// and requires a client X.509-SVID that verifies against src's bundle and belongs to the
// trust domain of src's own SVID (read at each handshake, so the server never accepts a
// foreign trust domain, federated or not). A client without such an SVID fails the
// handshake. NextProtos offers HTTP/2 and HTTP/1.1.
//
// Which member of the trust domain may do what is the handler's decision: see PeerID.
func ServerTLSConfig(src Source) *tls.Config {
	cfg := tlsconfig.MTLSServerConfig(src, src, authorizeOwnTrustDomain(src))
	cfg.NextProtos = []string{"h2", "http/1.1"}
	return cfg
}

func authorizeOwnTrustDomain(src Source) tlsconfig.Authorizer {
	return func(id spiffeid.ID, chains [][]*x509.Certificate) error {
		own, err := src.GetX509SVID()
		if err != nil {
			return fmt.Errorf("workload: authorize %s: %w", id, err)
		}
		return tlsconfig.AuthorizeMemberOf(own.ID.TrustDomain())(id, chains)
	}
}

// ClientTLSConfig returns an environment's mTLS configuration for dialing the server with
// SPIFFE ID server (usually FacadeID): it presents src's current SVID and accepts only a
// server SVID for exactly that ID that verifies against src's bundle. Host names are not
// checked; the SPIFFE ID is. To speak HTTP/2, use it in an http.Transport with
// ForceAttemptHTTP2.
func ClientTLSConfig(src Source, server spiffeid.ID) *tls.Config {
	return tlsconfig.MTLSClientConfig(src, src, tlsconfig.AuthorizeID(server))
}

// PeerID returns the SPIFFE ID of the client SVID of r's connection. It trusts the TLS
// layer to have verified that SVID, as ServerTLSConfig does in the handshake; behind any
// other TLS configuration the result means nothing. It fails with ErrNoPeerID when r did
// not come over TLS or carries no client certificate with one SPIFFE ID.
func PeerID(r *http.Request) (spiffeid.ID, error) {
	if r.TLS == nil || !r.TLS.HandshakeComplete {
		return spiffeid.ID{}, fmt.Errorf("workload: request not over tls: %w", ErrNoPeerID)
	}
	var leaf *x509.Certificate
	switch {
	case len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0:
		leaf = r.TLS.VerifiedChains[0][0]
	case len(r.TLS.PeerCertificates) > 0:
		// ServerTLSConfig verifies in VerifyPeerCertificate, which leaves VerifiedChains empty.
		leaf = r.TLS.PeerCertificates[0]
	default:
		return spiffeid.ID{}, fmt.Errorf("workload: no client certificate: %w", ErrNoPeerID)
	}
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("workload: client certificate: %w: %w", ErrNoPeerID, err)
	}
	return id, nil
}

// GuestServerTLSConfig is the facade's TLS configuration for microVM guests, which have no
// SVID yet: it presents src's SVID and asks for no client certificate. Guests pin the CA
// (src's bundle) and the facade's SPIFFE ID with GuestClientTLSConfig; they authenticate
// with single-use tokens inside the connection.
func GuestServerTLSConfig(src Source) *tls.Config {
	cfg := tlsconfig.TLSServerConfig(src)
	cfg.NextProtos = []string{"h2", "http/1.1"}
	return cfg
}

// GuestClientTLSConfig is a guest's TLS configuration: it trusts only bundle and accepts only
// a server SVID for exactly the ID server.
func GuestClientTLSConfig(bundle x509bundle.Source, server spiffeid.ID) *tls.Config {
	return tlsconfig.TLSClientConfig(bundle, tlsconfig.AuthorizeID(server))
}
