#!/usr/bin/env bash
# Builds (once per version) the real components the demo and the integration tests run:
# Gitea and the Gitea runner, from the Go module proxy, cached under
# ${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}/tools/<name>-<version>.
# Usage: scripts/tools.sh [gitea|gitea-runner|all]   (prints nothing but errors and progress)
set -euo pipefail

GITEA_VERSION=${GITEA_VERSION:-v1.27.3}
GITEA_RUNNER_VERSION=${GITEA_RUNNER_VERSION:-v1.0.8}
CACHE=${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}
TOOLS=$CACHE/tools
mkdir -p "$TOOLS"

log() { printf 'tools: %s\n' "$*" >&2; }

# shellcheck source=scripts/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"

build_gitea() {
  local dir=$TOOLS/gitea-$GITEA_VERSION
  [ -x "$dir/gitea" ] && return 0
  log "building Gitea $GITEA_VERSION (about 6 minutes on 2 cores, once)"
  local src tmp
  src=$(go mod download -json "code.gitea.io/gitea@$GITEA_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$src" ] || { log "go mod download code.gitea.io/gitea@$GITEA_VERSION printed no Dir"; return 1; }
  tmp=$(mktemp -d "$TOOLS/.gitea-build.XXXXXX")
  cp -r "$src/." "$tmp/src"
  chmod -R u+w "$tmp/src"
  (cd "$tmp/src" && GOFLAGS=-mod=mod go build -trimpath -tags 'sqlite sqlite_unlock_notify' -o "$tmp/src/gitea" .)
  # Without the bindata tag Gitea reads templates and locales from its source tree at run time,
  # so the source tree stays beside the binary (STATIC_ROOT_PATH points at it).
  rm -rf "$dir"
  mv "$tmp/src" "$dir"
  rmdir "$tmp"
  log "Gitea $GITEA_VERSION ready at $dir/gitea"
}

build_runner() {
  local dir=$TOOLS/gitea-runner-$GITEA_RUNNER_VERSION
  # The binary must report its version: executors check it besides the SHA-256.
  if reports "$dir/gitea-runner" "$GITEA_RUNNER_VERSION"; then
    return 0
  fi
  log "building the Gitea runner $GITEA_RUNNER_VERSION (about 1 minute, once)"
  local tmp
  tmp=$(mktemp -d "$TOOLS/.runner-build.XXXXXX")
  (cd "$tmp" && go mod init runnerbuild >/dev/null 2>&1 &&
    go get -tool "gitea.com/gitea/runner@$GITEA_RUNNER_VERSION" >/dev/null 2>&1 &&
    CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X gitea.com/gitea/runner/internal/pkg/ver.version=$GITEA_RUNNER_VERSION" \
      -o gitea-runner gitea.com/gitea/runner)
  mkdir -p "$dir"
  mv "$tmp/gitea-runner" "$dir/gitea-runner"
  sha256sum "$dir/gitea-runner" | cut -d' ' -f1 >"$dir/gitea-runner.sha256"
  rm -rf "$tmp"
  log "Gitea runner $GITEA_RUNNER_VERSION ready at $dir/gitea-runner"
}

case "${1:-all}" in
  gitea) with_lock gitea build_gitea ;;
  gitea-runner) with_lock runner build_runner ;;
  all) with_lock runner build_runner; with_lock gitea build_gitea ;;
  *) log "unknown tool ${1}: want gitea, gitea-runner or all"; exit 2 ;;
esac
