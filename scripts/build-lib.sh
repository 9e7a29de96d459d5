# Shared by the scripts that build tools into the cache ($TOOLS must be set): source it.

# with_lock NAME CMD... runs CMD holding $TOOLS/.NAME.lock, which serialises concurrent builds
# of the same tool (parallel test packages, a CI step beside a test, a demo beside a test).
with_lock() {
  local name=$1; shift
  exec {fd}>"$TOOLS/.$name.lock"
  flock "$fd"
  "$@"
  exec {fd}>&-
}

# run_quiet LOG CMD... runs a build step with its output in LOG, shown only when the step fails.
run_quiet() {
  local logf=$1; shift
  if ! "$@" >"$logf" 2>&1; then
    tail -n 40 "$logf" >&2
    return 1
  fi
}

# reports BIN WANT succeeds when BIN exists and `BIN --version` prints WANT. The output is read
# whole first: a `| grep -q` would close the pipe early, and under pipefail the SIGPIPE of a
# program printing several lines would fail the check and rebuild a tool already there.
reports() {
  local bin=$1 want=$2 out
  [ -x "$bin" ] || return 1
  out=$("$bin" --version 2>&1) || return 1
  [[ $out == *"$want"* ]]
}

# cloud_kernel_package prints the versioned package linux-image-cloud-amd64 depends on (Debian's
# cloud kernel: virtio built for VMs), running apt-get update once when apt knows none.
cloud_kernel_package() {
  local meta=linux-image-cloud-amd64 pkg
  pkg=$(apt-cache depends "$meta" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n1)
  if [ -z "$pkg" ]; then
    apt-get update -qq >/dev/null
    pkg=$(apt-cache depends "$meta" | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n1)
  fi
  [ -n "$pkg" ] || return 1
  printf '%s\n' "$pkg"
}

# module_path DIR NAME prints the path of NAME.ko below DIR.
module_path() {
  local f
  f=$(find "$1" -name "$2.ko" -o -name "$(printf %s "$2" | tr _ -).ko" | head -n1)
  [ -n "$f" ] || { printf 'kernel module %s not found below %s\n' "$2" "$1" >&2; return 1; }
  printf '%s\n' "$f"
}

# module_order MODDIR NAME... prints the modules to load, each after its dependencies. Built-in
# modules (modules.builtin) are skipped.
module_order() {
  local moddir=$1; shift
  declare -A seen=()
  local order=()
  visit() {
    local name=$1 path deps d
    [ -n "${seen[$name]:-}" ] && return 0
    seen[$name]=1
    if grep -qE "/$name\.ko$" "$moddir/modules.builtin"; then return 0; fi
    path=$(module_path "$moddir/kernel" "$name") || return 1
    deps=$(tr '\0' '\n' <"$path" | sed -n 's/^depends=//p' | head -n1)
    for d in ${deps//,/ }; do visit "$d" || return 1; done
    order+=("$path")
  }
  for m in "$@"; do visit "$m" || return 1; done
  printf '%s\n' "${order[@]}"
}

# fetch_cloud_kernel DIR puts Debian's cloud kernel into DIR: vmlinuz, modules/ (its module tree)
# and kernel-version. Needs apt-get download and dpkg; returns non-zero with a message on failure.
fetch_cloud_kernel() {
  local dir=$1 tmp pkg kver
  pkg=$(cloud_kernel_package) || { echo "cannot resolve the package linux-image-cloud-amd64 depends on" >&2; return 1; }
  tmp=$(mktemp -d "$dir/.kernel.XXXXXX")
  echo "downloading $pkg" >&2
  if ! (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1); then
    rm -rf "$tmp"
    echo "apt-get download $pkg failed" >&2
    return 1
  fi
  dpkg -x "$tmp"/"$pkg"_*.deb "$tmp/x"
  kver=${pkg#linux-image-}
  cp "$tmp/x/boot/vmlinuz-$kver" "$dir/vmlinuz"
  rm -rf "$dir/modules"
  mv "$tmp/x/lib/modules/$kver" "$dir/modules"
  printf '%s\n' "$kver" >"$dir/kernel-version"
  rm -rf "$tmp"
}

# debootstrap_userland ROOTFS SUITE MIRROR PACKAGES makes a Debian minbase root file system with
# PACKAGES (comma-separated) in ROOTFS and strips what must not go into an image: apt lists and
# caches, logs, shell history, SSH host keys, the machine id (emptied, made per boot), name
# servers (given at run time). Its log is ROOTFS.log, shown when it fails.
debootstrap_userland() {
  local r=$1 suite=$2 mirror=$3 packages=$4
  if ! debootstrap --variant=minbase --include="$packages" "$suite" "$r" "$mirror" >"$r.log" 2>&1; then
    tail -n 30 "$r.log" >&2
    echo "debootstrap failed" >&2
    return 1
  fi
  rm -rf "$r/var/lib/apt/lists/"* "$r/var/cache/apt/"*.bin "$r/var/cache/apt/archives/"*.deb \
    "$r/var/log/"* "$r/tmp/"* "$r/root/.bash_history" "$r/etc/ssh/ssh_host_"*
  : >"$r/etc/resolv.conf"
  : >"$r/etc/machine-id"
  echo localhost >"$r/etc/hostname"
}
