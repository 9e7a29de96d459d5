// Package gitea is the forge.Forge of a Gitea server: a client of Gitea's RunnerService
// (/api/actions) authenticated as dynrunner's resident runner.
//
// Connect loads the resident runner's credentials from files (GITEA_RUNNER_UUID_FILE and
// GITEA_RUNNER_TOKEN_FILE) or the state directory, or registers the runner on first start with
// a registration token (GITEA_RUNNER_REGISTRATION_TOKEN_FILE) and keeps the credentials it got
// in the state directory (mode 0600); then it declares the runner's labels. The credentials
// never leave the controller.
package gitea
