// Package opensandboxtest is a fake OpenSandbox Lifecycle API server (httptest) for the
// opensandbox backend's tests, which cannot run the real server here. It speaks the published
// API (alibaba/OpenSandbox specs/sandbox-lifecycle.yml): POST/GET /sandboxes,
// GET/DELETE /sandboxes/{sandboxId}, under "/v1" and at the root as the real server, with the
// OPEN-SANDBOX-API-KEY header, the ErrorResponse body, X-Request-ID, metadata filtering and
// pagination. Sandboxes go Pending → Running and end as their ScriptEnv environment variable
// says. Knobs inject faults: failing the next requests with a status (and Retry-After), slow or
// malformed answers, refused keys, sandboxes that never become Running, a lingering delete.
package opensandboxtest
