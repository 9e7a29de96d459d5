#!/usr/bin/env bash
# Builds the microVM guest image for `dynrunner launcher` (VM_IMAGE, VM_KERNEL, VM_INITRAMFS,
# VM_CMDLINE) without any registry, into <outdir>:
#   rootfs.qcow2   the root disk: a Debian bookworm minbase with the job's userland (the same
#                  packages as the pod tier's executor image: deploy/userland-packages), a
#                  `runner` user (uid 1000, home /home/runner), the static dynrunner binary at
#                  /usr/local/bin/dynrunner and /sbin/dynrunner-init (and, with
#                  GITHUB_RUNNER_DIR, GitHub's runner at /opt/actions-runner); ext4 on the
#                  whole disk, grown to the disk's size at boot
#   vmlinuz        Debian's cloud kernel (linux-image-cloud-amd64)
#   initrd.img     busybox-static, that kernel's virtio and iso9660 modules and a first-stage
#                  init: it loads the modules, mounts the NoCloud seed, configures eth0 from its
#                  network-config (address, route, name servers), mounts the root disk and
#                  switches to it
#   cmdline        the kernel command line to boot with
# Boot it directly (no firmware, no boot loader): with Cloud Hypervisor
#   VM_KERNEL=<out>/vmlinuz VM_INITRAMFS=<out>/initrd.img VM_CMDLINE="$(cat <out>/cmdline)"
#   VM_IMAGE=<out>/rootfs.qcow2
# and with QEMU the same plus VM_HYPERVISOR=qemu. /sbin/dynrunner-init then runs
# `dynrunner guest` (one job as the runner user) and the VM powers off. The image holds no
# runner identity, token, password, SSH key or machine id.
#
# The root file system and the kernel are cached under
# ${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}/vm-guest-<recipe>-<packages hash>; each call only
# adds the dynrunner binary and the init, makes the disk and the initrd (seconds).
#
# Usage: deploy/vm-image/build.sh <outdir>
#   DYNRUNNER_BIN=path   a static dynrunner binary (CGO_ENABLED=0); default: built from this tree
#   DEBIAN_MIRROR        default http://deb.debian.org/debian
#   GITHUB_RUNNER_DIR=dir  the unpacked GitHub Actions runner (actions-runner-linux-x64-*.tar.gz,
#                        its run.sh at the top), added at /opt/actions-runner owned by the runner
#                        user, for GitHub slots on the vm tier (GITHUB_VM_RUNNER_BIN, default
#                        /opt/actions-runner/run.sh; pin its SHA-256 with GITHUB_VM_RUNNER_SHA256).
#                        Added on every call, not cached. Default: none
#   GUEST_EXTRA_PACKAGES Debian packages added to the userland, comma- or space-separated (the
#                        real runner's: libicu72 libkrb5-3 zlib1g liblttng-ust1 libssl3); the
#                        root file system is cached per package list
# Needs root (debootstrap), debootstrap, busybox-static, cpio, e2fsprogs, qemu-utils and
# apt-get download (scripts/vm-deps.sh installs them).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# Bump when anything below changes what ends up in the cached parts of the image.
RECIPE=1
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=$(grep -v '^#' "$ROOT/deploy/userland-packages" | paste -sd, -)
# Beside the userland: resize2fs grows the root file system to the disk at boot.
GUEST_PACKAGES=$PACKAGES,e2fsprogs
EXTRA=$(printf '%s' "${GUEST_EXTRA_PACKAGES:-}" | tr ', ' '\n\n' | grep -v '^$' | paste -sd, - || true)
if [ -n "$EXTRA" ]; then
  printf '%s' "$EXTRA" | grep -Eqx '[a-z0-9][a-z0-9.+-]*(,[a-z0-9][a-z0-9.+-]*)*' ||
    { printf 'vm-image: GUEST_EXTRA_PACKAGES=%s: want Debian package names\n' "$GUEST_EXTRA_PACKAGES" >&2; exit 1; }
  GUEST_PACKAGES=$GUEST_PACKAGES,$EXTRA
fi
RUNNER_DIR=${GITHUB_RUNNER_DIR:-}
CACHE=${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}
DIR=$CACHE/vm-guest-$RECIPE-$(printf %s "$GUEST_PACKAGES" | sha256sum | cut -c1-8)
# Modules the first stage loads (dependencies first; built-in ones are skipped).
WANT_MODULES="virtio_pci virtio_blk virtio_net isofs"

log() { printf 'vm-image: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[ $# -eq 1 ] || die "usage: $0 <outdir>"
OUT=$1
for tool in debootstrap busybox cpio gzip qemu-img mkfs.ext4 dpkg apt-get apt-cache tar; do
  command -v "$tool" >/dev/null || die "$tool is missing; run scripts/vm-deps.sh"
done
[ "$(id -u)" = 0 ] || die "building the root file system needs root (debootstrap)"

# shellcheck source=scripts/build-lib.sh
source "$ROOT/scripts/build-lib.sh"

TMPS=()
cleanup() { [ ${#TMPS[@]} -eq 0 ] || rm -rf "${TMPS[@]}"; }
trap cleanup EXIT

build_rootfs() {
  local tmp start
  start=$(date +%s)
  tmp=$(mktemp -d /var/tmp/dynrunner-guest.XXXXXX)
  TMPS+=("$tmp")
  log "debootstrap $SUITE minbase from $MIRROR (a few minutes, once per recipe)"
  local r=$tmp/rootfs
  debootstrap_userland "$r" "$SUITE" "$MIRROR" "$GUEST_PACKAGES" || die "the root file system could not be made"
  # The job's user, as in the executor image.
  chroot "$r" groupadd --gid 1000 runner
  chroot "$r" useradd --uid 1000 --gid 1000 --home-dir /home/runner --create-home --shell /bin/bash runner
  # Name servers and the host name come from the seed at boot.
  printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
  printf '/dev/root / ext4 rw,relatime 0 1\n' >"$r/etc/fstab"
  tar --numeric-owner --xattrs -C "$r" -cf "$DIR/rootfs.tar" .
  log "root file system cached in $(($(date +%s) - start))s ($(du -sh "$r" | cut -f1))"
}

build_kernel() {
  fetch_cloud_kernel "$DIR" || die "the cloud kernel could not be fetched"
}

# build_initrd OUT writes the initrd (cheap: made on every call, so initrd-init changes apply
# without a new recipe).
build_initrd() {
  local out=$1 tmp root m rel
  tmp=$(mktemp -d "$CACHE/.vm-guest-initrd.XXXXXX")
  TMPS+=("$tmp")
  root=$tmp/root
  mkdir -p "$root"/{bin,dev,etc,proc,sys,run,seed,newroot,lib/modules}
  cp /bin/busybox "$root/bin/busybox"
  ln -s busybox "$root/bin/sh"
  : >"$root/etc/modules-load"
  for m in $(module_order "$DIR/modules" $WANT_MODULES); do
    rel=${m#"$DIR/modules/"}
    mkdir -p "$root/lib/modules/$(dirname "$rel")"
    cp "$m" "$root/lib/modules/$rel"
    printf '%s\n' "$rel" >>"$root/etc/modules-load"
  done
  install -m 0755 "$HERE/initrd-init" "$root/init"
  (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet | gzip -9n) >"$out"
}

build() {
  [ -f "$DIR/.complete" ] && return 0
  mkdir -p "$DIR"
  log "building the guest image's cached parts in $DIR (once)"
  [ -f "$DIR/rootfs.tar" ] || build_rootfs
  [ -f "$DIR/vmlinuz" ] && [ -f "$DIR/kernel-version" ] || build_kernel
  touch "$DIR/.complete"
}

mkdir -p "$CACHE"
exec {lock}>"$DIR.lock"
flock "$lock"
build
exec {lock}>&-

if [ -n "$RUNNER_DIR" ]; then
  [ -f "$RUNNER_DIR/run.sh" ] || die "GITHUB_RUNNER_DIR=$RUNNER_DIR holds no run.sh: want the unpacked GitHub Actions runner"
fi

bin=${DYNRUNNER_BIN:-}
if [ -z "$bin" ]; then
  tmp=$(mktemp -d)
  TMPS+=("$tmp")
  bin=$tmp/dynrunner
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -o "$bin" ./cmd/dynrunner)
fi
[ -f "$bin" ] || die "DYNRUNNER_BIN=$bin is not a file"
if command -v file >/dev/null && ! file -b "$bin" | grep -q 'statically linked'; then
  die "$bin is not statically linked; build it with CGO_ENABLED=0"
fi

mkdir -p "$OUT"
stage=$(mktemp -d /var/tmp/dynrunner-guest-disk.XXXXXX)
TMPS+=("$stage")
tar --numeric-owner --xattrs -C "$stage" -xf "$DIR/rootfs.tar"
install -m 0755 "$bin" "$stage/usr/local/bin/dynrunner"
install -m 0755 "$HERE/dynrunner-init" "$stage/sbin/dynrunner-init"
if [ -n "$RUNNER_DIR" ]; then
  # GitHub's runner writes its configuration and diagnostics into its own directory: the
  # runner user's, as in the executor image.
  mkdir -p "$stage/opt/actions-runner"
  cp -a "$RUNNER_DIR/." "$stage/opt/actions-runner/"
  chown -R 1000:1000 "$stage/opt/actions-runner"
  log "GitHub Actions runner from $RUNNER_DIR at /opt/actions-runner"
fi
# The file system's own size: its content and 256 MiB; the guest grows it to the disk.
mib=$(($(du -sm "$stage" | cut -f1) * 12 / 10 + 256))
mkfs.ext4 -q -F -L dynrunner-root -d "$stage" "$stage.raw" "${mib}M" >/dev/null
TMPS+=("$stage.raw")
qemu-img convert -q -f raw -O qcow2 "$stage.raw" "$OUT/rootfs.qcow2"
build_initrd "$OUT/initrd.img"
cp "$DIR/vmlinuz" "$OUT/"
printf 'console=ttyS0 panic=-1 quiet\n' >"$OUT/cmdline"
log "guest image in $OUT (root file system ${mib} MiB)"
