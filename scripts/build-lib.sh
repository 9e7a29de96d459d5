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
