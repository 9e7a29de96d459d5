#!/usr/bin/env bash
# Builds (once per version) the Kubernetes control plane the kube pod backend's tests run against:
# kube-apiserver and etcd, from the Go module proxy, cached under
# ${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}/tools/<name>-<version>; and caches KEDA's
# ScaledObject CustomResourceDefinition, from the KEDA module's zip on the Go module proxy, in
# tools/keda-crds-<version>/, for the dry run of deploy/kubernetes (deploy/deploy_test.go).
# Usage: scripts/k8s-tools.sh [kube-apiserver|etcd|keda-crds|all]   (prints nothing but errors and progress)
# internal/testbed/kubetest finds them there (the binaries also through KUBE_APISERVER_BIN / ETCD_BIN).
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KEDA_VERSION=${KEDA_VERSION:-v2.21.1}
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

# KEDA's CRDs ship in its module zip (config/crd/bases). Only the zip is wanted: the module needs a
# newer Go than this project's, so go mod download reports an error after it has fetched the zip
# (and checked it against the checksum database, as for any module); that error is not fatal here.
KEDA_CRDS=(keda.sh_scaledobjects.yaml)

fetch_keda_crds() {
  local dir=$TOOLS/keda-crds-$KEDA_VERSION f missing=0
  for f in "${KEDA_CRDS[@]}"; do [ -s "$dir/$f" ] || missing=1; done
  [ "$missing" = 1 ] || return 0
  log "extracting KEDA $KEDA_VERSION's CRDs from its module zip (seconds, once)"
  local tmp zip
  tmp=$(mktemp -d "$TOOLS/.keda-crds.XXXXXX")
  zip=$(cd "$tmp" && { GOFLAGS=-mod=mod go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" 2>"$tmp/download.log" || true; } |
    sed -n 's/^\t"Zip": "\(.*\)",$/\1/p')
  if [ -z "$zip" ] || [ ! -s "$zip" ]; then
    cat "$tmp/download.log" >&2
    log "go mod download github.com/kedacore/keda/v2@$KEDA_VERSION gave no zip"
    rm -rf "$tmp"
    return 1
  fi
  # Go is the one unzip every machine of this project has.
  cat >"$tmp/unzip.go" <<'GO'
// unzip ZIP DIR MEMBER... writes each MEMBER of ZIP (its path inside the zip) into DIR, by its
// base name.
package main

import (
	"archive/zip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
)

func main() {
	zr, err := zip.OpenReader(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, want := range os.Args[3:] {
		if err := extract(&zr.Reader, want, filepath.Join(os.Args[2], path.Base(want))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

func extract(zr *zip.Reader, want, dst string) error {
	for _, f := range zr.File {
		if f.Name != want {
			continue
		}
		r, err := f.Open()
		if err != nil {
			return err
		}
		defer r.Close()
		data, err := io.ReadAll(io.LimitReader(r, 16<<20))
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o644)
	}
	return fmt.Errorf("%s is not in the zip", want)
}
GO
  local members=()
  for f in "${KEDA_CRDS[@]}"; do members+=("github.com/kedacore/keda/v2@$KEDA_VERSION/config/crd/bases/$f"); done
  mkdir -p "$tmp/out"
  if ! (cd "$tmp" && run_quiet "$tmp/unzip.log" go run unzip.go "$zip" "$tmp/out" "${members[@]}"); then
    rm -rf "$tmp"
    return 1
  fi
  for f in "${KEDA_CRDS[@]}"; do
    if ! grep -q '^kind: CustomResourceDefinition' "$tmp/out/$f"; then
      log "$f in github.com/kedacore/keda/v2@$KEDA_VERSION is no CustomResourceDefinition"
      rm -rf "$tmp"
      return 1
    fi
  done
  rm -rf "$dir"
  mv "$tmp/out" "$dir"
  rm -rf "$tmp"
  log "KEDA $KEDA_VERSION CRDs ready in $dir"
}

case "${1:-all}" in
  etcd) with_lock etcd build_etcd ;;
  kube-apiserver) with_lock kube-apiserver build_apiserver ;;
  keda-crds) with_lock keda-crds fetch_keda_crds ;;
  all) with_lock etcd build_etcd; with_lock kube-apiserver build_apiserver; with_lock keda-crds fetch_keda_crds ;;
  *) log "unknown tool ${1}: want kube-apiserver, etcd, keda-crds or all"; exit 2 ;;
esac
