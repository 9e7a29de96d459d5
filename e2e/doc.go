// Package e2e holds dynrunner's end-to-end tests: the real Gitea, the real Gitea runner and
// the dynrunner binary as a separate process, as an operator runs them.
package e2e
