#!/usr/bin/env bash
# Installs the GitHub Actions runner (actions/runner) for dynrunner's GitHub slots, pinned by
# version and by the SHA-256 of its release tarball, and prints the two settings environments
# need: GITHUB_RUNNER_BIN (its run.sh) and GITHUB_RUNNER_SHA256 (run.sh's SHA-256, which the
# executor checks before every job).
#
# The pin is the tarball's SHA-256: take it from the release page of the version you run
# (https://github.com/actions/runner/releases, "SHA-256 Checksums"), never from the download
# itself. Run this where the environments will find the runner: on the controller's host for
# local environments; for docker ones, into a directory that you then give the executor image's
# build, GITHUB_RUNNER_DIR=<install-dir> scripts/executor-image.sh, whose image runs it through
# a launcher (its GITHUB_RUNNER_BIN and GITHUB_RUNNER_SHA256 are the image's labels, not the
# values printed here); the kubernetes backend does not run GitHub slots yet (docs/github.md).
#
# Usage:
#   GITHUB_RUNNER_VERSION=2.330.0 GITHUB_RUNNER_TARBALL_SHA256=<sha256> \
#     scripts/github-runner.sh <install-dir> [tarball]
# With [tarball] (a file already downloaded) nothing is fetched; without it the tarball is
# downloaded from GitHub's release assets. The runner's own dependencies (ICU, libssl) must be
# installed in the image: see the runner's bin/installdependencies.sh.
set -euo pipefail

: "${GITHUB_RUNNER_VERSION:?set GITHUB_RUNNER_VERSION, e.g. 2.330.0}"
: "${GITHUB_RUNNER_TARBALL_SHA256:?set GITHUB_RUNNER_TARBALL_SHA256 from the release page of that version}"
dir=${1:?usage: scripts/github-runner.sh <install-dir> [tarball]}
tarball=${2:-}
arch=$(uname -m)
case "$arch" in
  x86_64) arch=x64 ;;
  aarch64) arch=arm64 ;;
  *) echo "github-runner: unsupported architecture $arch" >&2; exit 1 ;;
esac
name="actions-runner-linux-$arch-$GITHUB_RUNNER_VERSION.tar.gz"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$tarball" ]; then
  url="https://github.com/actions/runner/releases/download/v$GITHUB_RUNNER_VERSION/$name"
  echo "github-runner: downloading $url" >&2
  curl -fsSL -o "$tmp/$name" "$url"
  tarball=$tmp/$name
fi
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$got" != "${GITHUB_RUNNER_TARBALL_SHA256,,}" ]; then
  echo "github-runner: $tarball has SHA-256 $got, pinned $GITHUB_RUNNER_TARBALL_SHA256: refusing it" >&2
  exit 1
fi
mkdir -p "$dir"
tar -xzf "$tarball" -C "$dir"
[ -f "$dir/run.sh" ] || { echo "github-runner: $tarball holds no run.sh" >&2; exit 1; }
echo "GITHUB_RUNNER_BIN=$dir/run.sh"
echo "GITHUB_RUNNER_SHA256=$(sha256sum "$dir/run.sh" | cut -d' ' -f1)"
