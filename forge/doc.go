// Package forge is the upstream forge as dynrunner's resident runner sees it: the Forge
// interface through which the scheduler fetches tasks and keeps them alive, and the facade
// forwards environments' reports, with the resident runner's credentials.
//
// Forge speaks the RunnerService's messages (code.gitea.io/actions-proto-go). Its
// implementations live in subpackages, one per forge: gitea today.
package forge
