#!/usr/bin/env bash
# Builds the dynrunner executor image for the docker pod backend, without any registry:
#   1. a Debian bookworm minbase root filesystem made with debootstrap and loaded with
#      `docker import` as the base image (once per recipe version: skipped when the tag exists);
#   2. deploy/executor-image/Dockerfile FROM that base, adding the static dynrunner binary
#      (CGO_ENABLED=0) and the pinned Gitea runner (scripts/tools.sh builds it).
#   3. with GITHUB_RUNNER_DIR, GitHub's runner for GitHub slots: that directory (actions/runner
#      unpacked by scripts/github-runner.sh, or the tests' stand-in; it must hold an executable
#      run.sh) goes to /opt/github-runner, and deploy/executor-image/github-runner-launch.sh to
#      /usr/local/bin/github-runner, which runs it from a writable copy in the home tmpfs (the
#      runner writes next to itself; the root file system is read-only). The launcher is the
#      workers' GITHUB_RUNNER_BIN; the image's labels dynrunner.github-runner.bin and
#      dynrunner.github-runner.sha256 carry it and the SHA-256 for GITHUB_RUNNER_SHA256, which the
#      script also logs. Untested with the real actions/runner (see the launcher).
# Prints the image ID (sha256:...) on stdout, the value for POD_EXECUTOR_IMAGE; progress goes to
# stderr. Installs debootstrap with apt-get when missing (run as root on a fresh machine or CI).
# Usage: scripts/executor-image.sh            environment: DEBIAN_MIRROR, GITEA_RUNNER_VERSION,
#        EXECUTOR_IMAGE_TAG (default dynrunner-executor:dev, dynrunner-executor:dev-github with
#        GITHUB_RUNNER_DIR), GITHUB_RUNNER_DIR, DYNRUNNER_CACHE
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

# The job's userland, shared with the microVM guest (deploy/vm-image/build.sh).
PACKAGES=$(grep -v '^#' deploy/userland-packages | paste -sd, -)
# Bump RECIPE when the base's preparation changes: the tag names the recipe and the package
# list, so a changed recipe or list builds a new base instead of reusing a stale one.
RECIPE=2
SUITE=bookworm
BASE_TAG=dynrunner-executor-base:$SUITE-r$RECIPE-$(printf %s "$PACKAGES" | sha256sum | cut -c1-8)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
GITHUB_RUNNER_DIR=${GITHUB_RUNNER_DIR:-}
if [ -n "$GITHUB_RUNNER_DIR" ]; then
  TAG=${EXECUTOR_IMAGE_TAG:-dynrunner-executor:dev-github}
else
  TAG=${EXECUTOR_IMAGE_TAG:-dynrunner-executor:dev}
fi
# Where GITHUB_RUNNER_BIN points in an image with GitHub's runner.
GITHUB_RUNNER_LAUNCHER=/usr/local/bin/github-runner
GITEA_RUNNER_VERSION=${GITEA_RUNNER_VERSION:-v1.0.8}
CACHE=${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}
RUNNER=$CACHE/tools/gitea-runner-$GITEA_RUNNER_VERSION/gitea-runner

log() { printf 'executor-image: %s\n' "$*" >&2; }

# shellcheck source=scripts/build-lib.sh
source "$ROOT/scripts/build-lib.sh"
die() { log "$*"; exit 1; }

# Temporary directories, removed on exit whatever happens.
TMPS=()
cleanup() { [ ${#TMPS[@]} -eq 0 ] || rm -rf "${TMPS[@]}"; }
trap cleanup EXIT

command -v docker >/dev/null || die "the docker CLI is missing (apt-get install docker.io)"
docker version >/dev/null 2>&1 || die "the Docker engine does not answer (systemctl start docker; is $USER in the docker group?)"
command -v go >/dev/null || die "go is missing"
if [ -n "$GITHUB_RUNNER_DIR" ]; then
  [ -d "$GITHUB_RUNNER_DIR" ] || die "GITHUB_RUNNER_DIR=$GITHUB_RUNNER_DIR is not a directory"
  [ -f "$GITHUB_RUNNER_DIR/run.sh" ] && [ -x "$GITHUB_RUNNER_DIR/run.sh" ] ||
    die "GITHUB_RUNNER_DIR=$GITHUB_RUNNER_DIR holds no executable run.sh (unpack actions/runner there with scripts/github-runner.sh)"
fi

# Parallel builds (test packages, CI) share the base and the tag: one at a time.
mkdir -p "$CACHE"
exec {lock}>"$CACHE/.executor-image.lock"
flock "$lock"

ensure_debootstrap() {
  command -v debootstrap >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "debootstrap is missing; install it as root: apt-get update && apt-get install -y debootstrap"
  log "installing debootstrap"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
}

build_base() {
  if docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
    log "base $BASE_TAG cached"
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "building the base root filesystem needs root (debootstrap)"
  ensure_debootstrap
  local tmp start
  start=$(date +%s)
  tmp=$(mktemp -d /var/tmp/dynrunner-rootfs.XXXXXX)
  TMPS+=("$tmp")
  log "debootstrap $SUITE minbase from $MIRROR (a few minutes, once per recipe)"
  # Nothing of this host, and no identity, goes into the image: docker provides resolv.conf,
  # hosts and hostname at run time; no machine id, apt lists or caches.
  debootstrap_userland "$tmp/rootfs" "$SUITE" "$MIRROR" "$PACKAGES" || die "the base root file system could not be made"
  tar --numeric-owner --xattrs -C "$tmp/rootfs" -c . |
    docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["/bin/bash"]' \
      --message "debootstrap --variant=minbase $SUITE ($PACKAGES), recipe $RECIPE" \
      - "$BASE_TAG" >/dev/null
  log "base $BASE_TAG imported in $(($(date +%s) - start))s"
}

build_image() {
  if [ ! -x "$RUNNER" ]; then
    bash scripts/tools.sh gitea-runner
  fi
  local ctx sha version
  ctx=$(mktemp -d /var/tmp/dynrunner-image.XXXXXX)
  TMPS+=("$ctx")
  version=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo dev)
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$ctx/dynrunner" ./cmd/dynrunner
  cp "$RUNNER" "$ctx/gitea-runner"
  chmod 0755 "$ctx/dynrunner" "$ctx/gitea-runner"
  cp deploy/executor-image/Dockerfile "$ctx/Dockerfile"
  sha=$(sha256sum "$ctx/gitea-runner" | cut -d' ' -f1)
  local github=()
  if [ -n "$GITHUB_RUNNER_DIR" ]; then
    # Owned by root and not writable by the job's user, whatever the source's owner.
    cp -R --preserve=mode,timestamps "$GITHUB_RUNNER_DIR/." "$ctx/github-runner"
    chmod -R go-w,a+rX "$ctx/github-runner"
    install -m 0755 deploy/executor-image/github-runner-launch.sh "$ctx/github-runner-launch.sh"
    cat deploy/executor-image/github-runner.Dockerfile >>"$ctx/Dockerfile"
    local gsha rsha
    gsha=$(sha256sum "$ctx/github-runner-launch.sh" | cut -d' ' -f1)
    rsha=$(sha256sum "$ctx/github-runner/run.sh" | cut -d' ' -f1)
    github=(--label "dynrunner.github-runner.bin=$GITHUB_RUNNER_LAUNCHER"
      --label "dynrunner.github-runner.sha256=$gsha"
      --label "dynrunner.github-runner.run-sha256=$rsha")
  fi
  docker build -q --build-arg "BASE=$BASE_TAG" \
    --label "dynrunner.gitea-runner.version=$GITEA_RUNNER_VERSION" \
    --label "dynrunner.gitea-runner.sha256=$sha" \
    --label "dynrunner.base=$BASE_TAG" \
    "${github[@]}" \
    -t "$TAG" "$ctx" >/dev/null
  log "image $TAG built (dynrunner $version, gitea-runner $GITEA_RUNNER_VERSION sha256 $sha)"
  if [ -n "$GITHUB_RUNNER_DIR" ]; then
    log "with GitHub's runner from $GITHUB_RUNNER_DIR (run.sh sha256 $rsha): GITHUB_RUNNER_BIN=$GITHUB_RUNNER_LAUNCHER GITHUB_RUNNER_SHA256=$gsha"
  fi
}

build_base
build_image
docker image inspect --format '{{.Id}}' "$TAG"
