// Package config loads dynrunner's configuration from the environment into plain structs and
// validates it, failing closed: a half-configured setting is a boot error that says what to
// set. Long-lived credentials are only ever read from files (*_FILE variables). Its loaders
// take a getenv function; only cmd/dynrunner passes os.Getenv, and its configdocs_test.go
// checks docs/configuration.md against what they read.
package config
