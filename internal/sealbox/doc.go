// Package sealbox encrypts secrets at rest with AES-256-GCM.
//
// The controller keeps the secret material of an assignment (forge task secrets, runner
// tokens) in JetStream; DESIGN.md forbids clear text there. A Box seals such values with one
// 256-bit key and binds each sealed value to its context through additional authenticated
// data (AAD): callers pass e.g. "task/42", and a value sealed for task 42 does not open as
// the value of task 43.
//
// # Key
//
// New takes the key as the bytes of a key file (read with secretfile). It accepts exactly
// 32 bytes of key material in one of these forms, told apart by length alone:
//
//   - 43 or 44 characters: base64 of the 32 bytes, standard or URL alphabet, with or
//     without "=" padding (secretfile.LoadOrCreate writes unpadded base64url);
//   - 64 characters: hexadecimal, either case;
//   - 32 bytes: the raw key. Prefer a text form in files: secretfile trims trailing line
//     endings, which would corrupt a raw key that ends in one.
//
// Errors never contain the key.
//
// # Sealed format
//
//	version (1 byte, 0x01) | key id (4 bytes) | nonce (12 bytes) | ciphertext | tag (16 bytes)
//
// The key id is the first 4 bytes of SHA-256 of the 32-byte key. It lets Open tell a value
// sealed with another key (ErrWrongKey, e.g. after the key file was replaced) from a value
// that was altered or truncated, or is opened with the wrong AAD (ErrOpen). The version and
// key id are authenticated together with the caller's AAD. Nonces are random; one key
// should seal well under 2^32 values.
package sealbox
