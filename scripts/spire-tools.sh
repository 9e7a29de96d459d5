#!/usr/bin/env bash
# Builds (once per version) the SPIRE server and agent the Kubernetes end-to-end test issues its
# SVIDs with, from the Go module proxy, cached under
# ${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}/tools/spire-<version>/{spire-server,spire-agent}.
# Usage: scripts/spire-tools.sh   (prints nothing but errors and progress)
# internal/testbed/spiretest finds the binaries there (or through SPIRE_SERVER_BIN / SPIRE_AGENT_BIN).
set -euo pipefail

SPIRE_VERSION=${SPIRE_VERSION:-v1.13.3}
CACHE=${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}
TOOLS=$CACHE/tools
mkdir -p "$TOOLS"

log() { printf 'spire-tools: %s\n' "$*" >&2; }

# shellcheck source=scripts/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"

build_spire() {
  local dir=$TOOLS/spire-$SPIRE_VERSION
  if [ -x "$dir/spire-agent" ] && reports "$dir/spire-server" "${SPIRE_VERSION#v}"; then
    return 0
  fi
  log "building spire-server and spire-agent $SPIRE_VERSION (about 8 minutes on 2 cores, once)"
  local tmp
  tmp=$(mktemp -d "$TOOLS/.spire-build.XXXXXX")
  (cd "$tmp" &&
    run_quiet "$tmp/build.log" go mod init spirebuild &&
    run_quiet "$tmp/build.log" go get -tool "github.com/spiffe/spire/cmd/spire-server@$SPIRE_VERSION" &&
    run_quiet "$tmp/build.log" go get -tool "github.com/spiffe/spire/cmd/spire-agent@$SPIRE_VERSION" &&
    CGO_ENABLED=1 run_quiet "$tmp/build.log" go build -trimpath \
      -ldflags "-s -w" -o spire-server github.com/spiffe/spire/cmd/spire-server &&
    CGO_ENABLED=1 run_quiet "$tmp/build.log" go build -trimpath \
      -ldflags "-s -w" -o spire-agent github.com/spiffe/spire/cmd/spire-agent)
  mkdir -p "$dir"
  mv "$tmp/spire-server" "$tmp/spire-agent" "$dir/"
  rm -rf "$tmp"
  log "spire $SPIRE_VERSION ready in $dir"
}

with_lock spire build_spire
