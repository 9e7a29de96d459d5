#!/usr/bin/env bash
# Builds (once per version) the Kubernetes control plane the kube pod backend's tests run against:
# kube-apiserver and etcd, from the Go module proxy, cached under
# ${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}/tools/<name>-<version>.
# Usage: scripts/k8s-tools.sh [kube-apiserver|etcd|all]   (prints nothing but errors and progress)
# internal/testbed/kubetest finds the binaries there (or through KUBE_APISERVER_BIN / ETCD_BIN).
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CACHE=${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}
TOOLS=$CACHE/tools
mkdir -p "$TOOLS"

log() { printf 'k8s-tools: %s\n' "$*" >&2; }

# shellcheck source=scripts/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"


build_etcd() {
  local dir=$TOOLS/etcd-$ETCD_VERSION
  if reports "$dir/etcd" "etcd Version: ${ETCD_VERSION#v}"; then
    return 0
  fi
  log "building etcd $ETCD_VERSION (about 40 seconds on 2 cores, once)"
  local tmp
  tmp=$(mktemp -d "$TOOLS/.etcd-build.XXXXXX")
  (cd "$tmp" &&
    run_quiet "$tmp/build.log" go mod init etcdbuild &&
    run_quiet "$tmp/build.log" go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" &&
    CGO_ENABLED=0 run_quiet "$tmp/build.log" go build -trimpath -ldflags '-s -w' -o etcd go.etcd.io/etcd/server/v3)
  mkdir -p "$dir"
  mv "$tmp/etcd" "$dir/etcd"
  rm -rf "$tmp"
  log "etcd $ETCD_VERSION ready at $dir/etcd"
}

build_apiserver() {
  local dir=$TOOLS/kube-apiserver-$KUBE_VERSION
  if reports "$dir/kube-apiserver" "$KUBE_VERSION"; then
    return 0
  fi
  log "building kube-apiserver $KUBE_VERSION (about 5 minutes on 2 cores, once)"
  local gomod tmp minor staging
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  [ -n "$gomod" ] || { log "go mod download k8s.io/kubernetes@$KUBE_VERSION printed no GoMod"; return 1; }
  # kubernetes' go.mod replaces its staging modules with ./staging/...; a module requiring it must
  # pin each of them to the matching published release (v0.<minor>.<patch>) instead.
  staging=$(sed -n 's|^\t\(k8s\.io/[^ ]*\) => \./staging/.*$|\1|p' "$gomod")
  [ -n "$staging" ] || { log "no staging replaces in $gomod"; return 1; }
  tmp=$(mktemp -d "$TOOLS/.kube-apiserver-build.XXXXXX")
  minor=${KUBE_VERSION#v1.}
  {
    printf 'module apiserverbuild\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n\n' "$KUBE_VERSION"
    for m in $staging; do printf 'replace %s => %s v0.%s\n' "$m" "$m" "$minor"; done
  } >"$tmp/go.mod"
  printf 'package main\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >"$tmp/tools.go"
  # The blank import makes go mod tidy resolve the whole apiserver graph; the binary is the
  # command package itself.
  (cd "$tmp" &&
    run_quiet "$tmp/build.log" go mod tidy &&
    CGO_ENABLED=0 run_quiet "$tmp/build.log" go build -trimpath \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor%%.*} -X k8s.io/component-base/version.gitTreeState=clean" \
      -o kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver)
  mkdir -p "$dir"
  mv "$tmp/kube-apiserver" "$dir/kube-apiserver"
  rm -rf "$tmp"
  log "kube-apiserver $KUBE_VERSION ready at $dir/kube-apiserver"
}

case "${1:-all}" in
  etcd) with_lock etcd build_etcd ;;
  kube-apiserver) with_lock kube-apiserver build_apiserver ;;
  all) with_lock etcd build_etcd; with_lock kube-apiserver build_apiserver ;;
  *) log "unknown tool ${1}: want kube-apiserver, etcd or all"; exit 2 ;;
esac
