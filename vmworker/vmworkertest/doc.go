// Package vmworkertest holds test support for the VM worker's backends:
//
//   - Server, a fake OpenSandbox Lifecycle API server (httptest) that speaks the published
//     API (alibaba/OpenSandbox specs/sandbox-lifecycle.yml): POST/GET /sandboxes,
//     GET/DELETE /sandboxes/{sandboxId}, under "/v1" and at the root as the real server, with
//     the OPEN-SANDBOX-API-KEY header, the ErrorResponse body, X-Request-ID, metadata
//     filtering and pagination. Sandboxes go Pending → Running and end as their
//     ScriptEnv environment variable says. Knobs inject faults: failing the next requests with
//     a status (and Retry-After), slow or malformed answers, refused keys, sandboxes that never
//     become Running, a lingering delete.
//   - Nonces, an in-memory nonce store with the semantics of vmworker.Nonces.
//   - RunConformance, the conformance suite of VM backends (in the manner of podworkertest):
//     Start, Wait, Destroy, List, adoption after a restart, idempotent and concurrent Start,
//     a new epoch, a sandbox that never becomes ready, and that the capability token reaches
//     the environment only through a single-use nonce.
package vmworkertest
