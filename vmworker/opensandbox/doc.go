// Package opensandbox is the VM worker's backend on the OpenSandbox Lifecycle API
// (alibaba/OpenSandbox, specs/sandbox-lifecycle.yml): one Kata microVM per job, taken from a
// pre-warmed pool (extensions.poolRef, "ci-vm" by default).
//
// The backend speaks four operations of the API, all under the server URL (…/v1) and all
// authenticated with the OPEN-SANDBOX-API-KEY header:
//
//	POST   /sandboxes             create; 202 with the sandbox in state Pending
//	GET    /sandboxes/{sandboxId} state; 200, or 404 once the sandbox is gone
//	DELETE /sandboxes/{sandboxId} delete; 204, or 404 when it is already gone
//	GET    /sandboxes?metadata=…  list by metadata, paginated (page, pageSize, hasNextPage)
//
// Like the local launcher backend, Start never gives the credential to the sandbox: a Gitea
// assignment's capability token or a GitHub slot's JIT configuration (vmworker.SpecCredential).
// It issues a single-use nonce for the credential (vmworker.Nonces, the VM worker's own) and
// passes the sandbox only an instance id, the nonce and the nonce endpoint's URL, as the
// environment variables EnvInstanceID, EnvNonce and EnvEndpoint. The guest redeems the nonce
// once. The credential appears in no request the backend sends.
//
// Every sandbox carries metadata (Kubernetes labels on the server side) naming its task,
// epoch, scope and instance id, so List finds dynrunner's sandboxes after a controller
// restart, the worker adopts those a live assignment owns and reaps the rest, and a retried
// Start for the same task and epoch finds the sandbox it created before instead of creating a
// second one. The API has no client-chosen names, so Start converges concurrent starts of the
// same task and epoch after the fact: the oldest sandbox wins and the others are deleted. The
// worker never starts an assignment twice at once (its `dispatched` transition is fenced), so
// this only matters for races the worker already prevents.
//
// Errors: 401 and 403 are ErrUnauthorized (the API key was refused), 404 on a sandbox is
// podworker.ErrNotFound (on the collection, a wrong server URL, ErrRejected), 409 ErrConflict,
// 429 ErrRateLimited (after honouring Retry-After), 5xx, timeouts and transport failures
// ErrUnavailable (after bounded retries with backoff), other 4xx ErrRejected, a body that does
// not decode ErrMalformed, a sandbox that never becomes Running within Config.StartTimeout
// ErrStartTimeout (the sandbox is deleted), one that fails while starting ErrSandboxFailed.
// Server text in errors is sanitized: no error or log line contains the API key, the nonce or
// the credential, even when the server echoes a request.
package opensandbox
