// Package workload holds dynrunner's SPIFFE identity scheme and the plumbing around
// X.509-SVIDs: where an SVID comes from, the development CA, and the mTLS configurations of
// the facade and its clients.
//
// # Identities
//
// Each assignment (a task handed over at a fencing epoch) has its own SPIFFE ID, and the
// facade has one:
//
//	spiffe://<trust domain>/dynrunner/task/<task>/epoch/<epoch>   AssignmentID
//	spiffe://<trust domain>/dynrunner/facade                      FacadeID
//
// ParseAssignmentID accepts only the canonical form AssignmentID makes, in the expected
// trust domain; anything else fails with ErrNotAssignment. A reclaimed assignment gets a
// new epoch and so a new identity: an environment of the old epoch cannot speak for the
// new one.
//
// # Sources
//
// A Source yields the workload's current X.509-SVID and the trust bundles that verify its
// peers. FromWorkloadAPI reads them from the SPIFFE Workload API (SPIRE agent, CSI driver);
// FromFiles reads the three files svid.pem, svid_key.pem and bundle.pem that WriteSVIDFiles
// (or spiffe-helper) writes; DevCA.Source issues them from the development CA. The first
// two wait for the first SVID ("the environment waits for its SVID"); all three follow
// rotation.
//
// # Development CA
//
// DevCA is a self-managed CA for laptops, tests and single-host setups without SPIRE. It
// keeps its ECDSA P-256 key and certificate in a directory (files 0600, directory 0700),
// reuses them across restarts and replaces them within 30 days of expiry (validity one
// year). It must not be used where SPIRE is available.
//
// # TLS
//
// ServerTLSConfig is the facade's side: it presents the facade's SVID and requires a client
// SVID of its own trust domain, verified against the bundle at every handshake. The facade
// then reads the client's identity with PeerID and authorizes it against the assignment
// with ParseAssignmentID. ClientTLSConfig is the environment's side and accepts only the
// given server identity.
package workload
