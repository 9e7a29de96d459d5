#!/usr/bin/env bash
# Builds the guest image of the VM test tier and copies it to <outdir>:
#   vmlinuz             the kernel of Debian's cloud kernel package (linux-image-*-cloud-amd64)
#   initramfs.cpio.gz   busybox-static, the virtio/iso9660 modules of that kernel and an /init
#                       that configures the network from the NoCloud seed, then runs
#                       `/bin/dynrunner guest --seed-dir /seed` (when DYNRUNNER_BIN was given) or,
#                       with dynrunner.test=ping on the kernel command line, fetches
#                       <endpoint>/v1/ping and prints the answer; then it powers off
#                       (dynrunner.test=hang: it never powers off, for deadline and kill tests)
#   base.qcow2          a 64 MiB ext4 disk for --image (the guest mounts it at /scratch)
#   cmdline             the kernel command line the test tier boots with
# The kernel, modules, base initramfs and disk are cached under
# ${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}/vm-image-<recipe version>; only the dynrunner binary
# is added per call (a second cpio archive appended to the cached one).
#
# Usage: scripts/vm-test-image.sh <outdir>
#   DYNRUNNER_BIN=path  a static dynrunner binary (CGO_ENABLED=0) to put at /bin/dynrunner
# Needs: scripts/vm-deps.sh (busybox-static, cpio, qemu-utils, e2fsprogs) and apt-get download.
set -euo pipefail

# shellcheck source=scripts/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"

# Bump when anything below changes what ends up in the image.
RECIPE=1
CACHE=${DYNRUNNER_CACHE:-$HOME/.cache/dynrunner}
DIR=$CACHE/vm-image-$RECIPE

log() { printf 'vm-test-image: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[ $# -eq 1 ] || die "usage: $0 <outdir>"
OUT=$1
for tool in busybox cpio gzip qemu-img mkfs.ext4 dpkg apt-get apt-cache; do
  command -v "$tool" >/dev/null || die "$tool is missing; run scripts/vm-deps.sh"
done
# (the applet list is read whole: `| grep -q` would SIGPIPE busybox and fail under pipefail)
[ -x /bin/busybox ] && [[ $'\n'$(/bin/busybox --list)$'\n' == *$'\ninsmod\n'* ]] || die "busybox-static is missing; run scripts/vm-deps.sh"
if [ -n "${DYNRUNNER_BIN:-}" ]; then
  [ -f "$DYNRUNNER_BIN" ] || die "DYNRUNNER_BIN=$DYNRUNNER_BIN is not a file"
  if command -v file >/dev/null && ! file -b "$DYNRUNNER_BIN" | grep -q 'statically linked'; then
    die "DYNRUNNER_BIN=$DYNRUNNER_BIN is not statically linked; build it with CGO_ENABLED=0"
  fi
fi

# Modules the init loads, dependencies first (resolved from each module's depends= below).
WANT_MODULES="virtio_pci virtio_blk virtio_net isofs"

build_kernel() {
  fetch_cloud_kernel "$DIR" || die "the cloud kernel could not be fetched"
}

write_init() {
  cat >"$1" <<'INIT'
#!/bin/sh
# dynrunner test guest init (scripts/vm-test-image.sh)
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /tmp /run /seed /scratch
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
say() { echo "dynrunner-init: $*" >/dev/console; }
off() { say "powering off"; sync; poweroff -f; }

while read -r m; do insmod "/lib/modules/$m" || say "insmod $m failed"; done </etc/modules-load

# The NoCloud seed is the virtio disk holding an iso9660 file system labelled cidata.
seed=
for i in 1 2 3 4 5 6 7 8 9 10; do
  for d in /dev/vd?; do
    [ -b "$d" ] || continue
    if mount -t iso9660 -o ro "$d" /seed 2>/dev/null; then
      if [ -f /seed/meta-data ]; then seed=$d; break 2; fi
      umount /seed
    fi
  done
  sleep 0.2
done
[ -n "$seed" ] || { say "no cidata seed found"; off; }
say "seed on $seed"
for d in /dev/vd?; do
  [ "$d" = "$seed" ] && continue
  mount -t ext4 "$d" /scratch 2>/dev/null && { say "scratch disk $d on /scratch"; break; }
done

# The values are double-quoted YAML scalars written by the launcher.
val() { sed -n "s/^ *$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *\$/\1/p" "$2" | head -n1; }
mac=$(val macaddress /seed/network-config)
addr=$(sed -n 's/^ *- *"\{0,1\}\([0-9.]*\/[0-9]*\)"\{0,1\} *$/\1/p' /seed/network-config | head -n1)
gw=$(val via /seed/network-config)
endpoint=$(val dynrunner-endpoint /seed/meta-data)
hostname "$(val local-hostname /seed/meta-data)"
ifc=
for n in /sys/class/net/*; do
  [ "$(cat "$n/address")" = "$mac" ] && ifc=${n##*/}
done
[ -n "$ifc" ] || { say "no interface with MAC $mac"; off; }
[ "$ifc" = eth0 ] || ip link set dev "$ifc" name eth0
ip link set dev lo up
ip link set dev eth0 up
ip addr add "$addr" dev eth0
ip route add default via "$gw"
say "eth0 $mac $addr via $gw"

if grep -qw 'dynrunner.test=ping' /proc/cmdline; then
  # Not wget -T: Debian's busybox-static 1.35 segfaults with it.
  if answer=$(timeout 20 wget -q -O - "$endpoint/v1/ping" 2>&1); then
    say "ping answer: $answer"
  else
    say "ping failed: $answer"
  fi
elif grep -qw 'dynrunner.test=hang' /proc/cmdline; then
  say "hanging (dynrunner.test=hang): never powering off"
  while :; do sleep 3600; done
elif [ -x /bin/dynrunner ]; then
  say "starting dynrunner guest"
  /bin/dynrunner guest --seed-dir /seed </dev/null >/dev/console 2>&1
  say "dynrunner guest exited with $?"
else
  say "nothing to run (no /bin/dynrunner, no dynrunner.test on the command line)"
fi
off
INIT
  chmod 0755 "$1"
}

build_initramfs() {
  local tmp root kver m rel
  tmp=$(mktemp -d "$CACHE/.vm-initramfs.XXXXXX")
  root=$tmp/root
  kver=$(cat "$DIR/kernel-version")
  mkdir -p "$root"/{bin,dev,etc,proc,sys,tmp,run,seed,scratch,lib/modules}
  cp /bin/busybox "$root/bin/busybox"
  ln -s busybox "$root/bin/sh"
  : >"$root/etc/modules-load"
  local mods
  mods=$(module_order "$DIR/modules" $WANT_MODULES)
  for m in $mods; do
    rel=${m#"$DIR/modules/"}
    mkdir -p "$root/lib/modules/$(dirname "$rel")"
    cp "$m" "$root/lib/modules/$rel"
    printf '%s\n' "$rel" >>"$root/etc/modules-load"
  done
  log "modules for $kver: $(xargs -n1 basename <"$root/etc/modules-load" | tr '\n' ' ')"
  write_init "$root/init"
  (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet | gzip -9n) >"$tmp/initramfs.cpio.gz"
  mv "$tmp/initramfs.cpio.gz" "$DIR/initramfs.cpio.gz"
  rm -rf "$tmp"
}

build_disk() {
  local tmp
  tmp=$(mktemp -d "$CACHE/.vm-disk.XXXXXX")
  mkdir -p "$tmp/content"
  printf 'dynrunner test scratch disk\n' >"$tmp/content/README"
  mkfs.ext4 -q -F -L scratch -d "$tmp/content" "$tmp/base.raw" 64M >/dev/null
  qemu-img convert -q -f raw -O qcow2 "$tmp/base.raw" "$tmp/base.qcow2"
  mv "$tmp/base.qcow2" "$DIR/base.qcow2"
  rm -rf "$tmp"
}

build() {
  [ -f "$DIR/.complete" ] && return 0
  mkdir -p "$DIR"
  log "building the test guest image in $DIR (once)"
  [ -f "$DIR/vmlinuz" ] && [ -f "$DIR/kernel-version" ] || build_kernel
  build_initramfs
  build_disk
  printf 'console=ttyS0 panic=-1 quiet\n' >"$DIR/cmdline"
  touch "$DIR/.complete"
}

mkdir -p "$CACHE"
exec {lock}>"$CACHE/.vm-image-$RECIPE.lock"
flock "$lock"
build
exec {lock}>&-

mkdir -p "$OUT"
cp "$DIR/vmlinuz" "$DIR/base.qcow2" "$DIR/cmdline" "$OUT/"
if [ -n "${DYNRUNNER_BIN:-}" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/bin"
  cp "$DYNRUNNER_BIN" "$tmp/bin/dynrunner"
  chmod 0755 "$tmp/bin/dynrunner"
  # A second archive appended to the first: the kernel unpacks both in order.
  (cd "$tmp" && printf 'bin\nbin/dynrunner\n' | cpio -o -H newc -R 0:0 --quiet | gzip -1n) >"$tmp/extra.cpio.gz"
  cat "$DIR/initramfs.cpio.gz" "$tmp/extra.cpio.gz" >"$OUT/initramfs.cpio.gz"
else
  cp "$DIR/initramfs.cpio.gz" "$OUT/"
fi
