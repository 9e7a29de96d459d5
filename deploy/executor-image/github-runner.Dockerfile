# Appended to the executor image's Dockerfile by scripts/executor-image.sh when GITHUB_RUNNER_DIR
# is set: GitHub's runner (actions/runner unpacked, or the tests' stand-in), installed read-only
# at /opt/github-runner, and the launcher that GITHUB_RUNNER_BIN names, which runs it from a
# writable copy in the home directory's tmpfs (see github-runner-launch.sh).
COPY github-runner /opt/github-runner
COPY github-runner-launch.sh /usr/local/bin/github-runner
