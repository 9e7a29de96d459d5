// Package guest is guest-runner: what runs inside a one-shot microVM (`dynrunner guest`). It
// reads the NoCloud seed (instance id, nonce, nonce endpoint — never a token), redeems the
// nonce once for the assignment's capability token, the facade's URL, SPIFFE ID and CA, and
// the pinned Gitea runner, then runs exactly one job as the executor does and powers off.
//
// Until VM attestation exists the guest has no SPIFFE identity: it authenticates to the facade
// with the single-use token over TLS that pins the facade's CA and SPIFFE ID.
package guest
