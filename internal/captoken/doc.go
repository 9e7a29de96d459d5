// Package captoken issues and verifies capability tokens: short bearer strings that let one
// environment do one thing for one assignment, such as registering its ephemeral runner at
// the facade.
//
// A token names the assignment (task id and fencing epoch), its purpose, its expiry and a
// fresh random 128-bit nonce, and carries an HMAC-SHA256 over all of that with the
// controller's capability key (RUNNER_FACADE_CAPABILITY_KEY_FILE, at least 32 bytes). Its
// wire form is URL-safe text:
//
//	drc2.<task>.<epoch>.<purpose>.<expires>.<nonce>.<mac>
//
// where task and epoch are decimal, purpose is one of the Purpose constants, expires is
// decimal Unix seconds, nonce (16 bytes) and mac (32 bytes) are unpadded base64url. The MAC
// covers the wire form up to the last dot, so it authenticates the version prefix and the
// expiry too. Verify accepts only the canonical form that Issue produces: no sign, no leading
// zero, no padding. Tokens of the first version (drc1, without an expiry) are refused as
// malformed, with "unknown version".
//
// # Expiry
//
// Every token expires: its issuer gives it the deadline by which it must be used, which for a
// register token is the assignment's pickup deadline (counted from its claim, or from its
// admission when it queued; a token is issued only once the assignment is admitted). Issue
// truncates it to the second, so a token never outlives its deadline. Verify does not look at
// the clock: the caller refuses a token that Token.Expired reports expired at its first use,
// and says which deadline passed.
//
// # Single use
//
// This package does not decide that a token is used only once: a valid token verifies
// every time. The caller redeems a token by recording its ID in JetStream with
// compare-and-swap (create-only) before acting on it, and refuses a token whose ID is
// already recorded. The caller also checks that the token's epoch is still the
// assignment's current epoch and that its purpose is the one the endpoint serves, so a
// token dies with its assignment handover.
//
// # Secrecy
//
// The wire form is a bearer secret. Token.Secret returns it; String, GoString, Format (every
// fmt verb), LogValue and MarshalJSON return a redacted form that names the task, epoch,
// purpose, expiry and ID, so logging a Token by accident leaks nothing. ID is safe to log and to
// store. Errors from Verify never contain the presented token.
package captoken
