#!/bin/sh
# GITHUB_RUNNER_BIN of an executor image built with GITHUB_RUNNER_DIR (scripts/executor-image.sh):
# runs GitHub's runner, installed read-only at /opt/github-runner, from $HOME/actions-runner.
#
# GitHub's runner writes next to itself (.runner, .credentials, _diag/), and a docker
# environment's root file system is read-only; the home directory is a writable tmpfs. So this
# makes $HOME/actions-runner with copies of the runner's top-level files (run.sh resolves its
# own links to find its directory) and of bin/ (the runner takes its root from its executable's
# real path, bin's parent), and links to every other directory (externals/, only read), then
# runs its run.sh with the executor's environment and arguments. The copy of bin/ costs its size
# (some 100 MB for actions/runner) of the environment's memory, as tmpfs pages do.
#
# Untested with the real actions/runner: the tests run the stand-in runner
# (forge/github/githubtest/standinrunner) through it. Check a real runner's first job before
# relying on it.
set -eu
src=/opt/github-runner
dst=${HOME:?HOME is not set}/actions-runner
if [ ! -x "$src/run.sh" ]; then
  echo "github-runner: $src/run.sh is missing or not executable: build the image with GITHUB_RUNNER_DIR (scripts/executor-image.sh)" >&2
  exit 1
fi
mkdir -p -m 0700 "$dst"
for f in "$src"/* "$src"/.[!.]*; do
  [ -e "$f" ] || continue
  name=${f##*/}
  if [ -d "$f" ] && [ "$name" != bin ]; then
    ln -sfn "$f" "$dst/$name"
  else
    cp -R --preserve=mode,timestamps "$f" "$dst/$name"
  fi
done
exec "$dst/run.sh" "$@"
