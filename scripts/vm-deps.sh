#!/usr/bin/env bash
# Installs the Debian packages the VM test tier needs (QEMU with TCG, qemu-img, genisoimage for
# NoCloud seeds, busybox-static and cpio for the test initramfs, iproute2 for the bridge and TAP
# devices, e2fsprogs for the base image, debootstrap for the guest's and the executor image's
# Debian userland, nftables for the guests' firewall). Idempotent and quiet: it runs apt-get update at most once
# and only when something is missing, and prints what it installed. Needs root (CI runs as root).
# Usage: scripts/vm-deps.sh
set -euo pipefail

# package -> a file the package provides, to tell whether it is installed without dpkg queries.
declare -A PROBE=(
  [qemu-system-x86]=/usr/bin/qemu-system-x86_64
  [qemu-utils]=/usr/bin/qemu-img
  [genisoimage]=/usr/bin/genisoimage
  [busybox-static]=/bin/busybox
  [cpio]=/usr/bin/cpio
  [iproute2]=/usr/sbin/ip
  [e2fsprogs]=/usr/sbin/mkfs.ext4
  # Not a VM tool: the docker tier's executor image is a debootstrap root filesystem. Installed
  # here, before the tests, so no test runs apt-get while another does.
  [debootstrap]=/usr/sbin/debootstrap
  # The microVM guests' egress firewall (VM_EGRESS), set up by the controller.
  [nftables]=/usr/sbin/nft
)

log() { printf 'vm-deps: %s\n' "$*" >&2; }

missing=()
for pkg in qemu-system-x86 qemu-utils genisoimage busybox-static cpio iproute2 e2fsprogs debootstrap nftables; do
  # busybox (dynamic) also installs /bin/busybox, so check the package itself as well.
  if [ -e "${PROBE[$pkg]}" ] && dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
    continue
  fi
  missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  log "missing ${missing[*]}; run as root: sudo $0"
  exit 1
fi
log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
log "installed ${missing[*]}"
