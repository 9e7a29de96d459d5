// Package secretfile reads and writes credential files.
//
// dynrunner takes every long-lived credential from a file (the *_FILE settings), never from
// an environment variable or a flag. Read is the one way such a file is read: the path must
// name an existing regular file (symbolic links are followed, since Kubernetes mounts
// secrets as links), the file must not be readable or writable by "other" users, and it must
// not be empty. One or more trailing line endings ("\n" or "\r\n") are removed, so a secret
// written with echo or an editor reads the same as one written with printf.
//
// Errors name the path and what is wrong with the file; they never contain its content.
//
// WriteNew replaces a file atomically with mode 0600, and LoadOrCreate keeps a generated
// key: n random bytes stored as unpadded base64url text (RFC 4648 section 5, no "="), one
// line, so an operator can copy it. The key material is that text, as Read returns it.
package secretfile
