package e2e

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/devforge"
)

// TestDockerJobCannotExhaustTheFacade plays an attacker inside a docker-backend job that uses
// its own SVID against the facade: a 255 KB gzip body that inflates to 256 MiB, a 100 MB plain
// body, four requests trickling their bodies at 1 KiB/s, and a fifth while those are in flight.
// Each is refused or cut off, and the controller's peak memory stays within a bound.
func TestDockerJobCannotExhaustTheFacade(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	image := executorImage(t)
	f := startForge(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "exhaust")
	require.NoError(t, err)
	// The job network is not what this test is about: the host's, so the loopback forge works.
	c := newController(t, tools, f, "", leaseEnv, pickupEnv, "POD_BACKEND=docker", "POD_EXECUTOR_IMAGE="+image, "POD_DOCKER_NETWORK=host")
	// The memory bound is for the controller operators run: the race detector's shadow memory
	// (5 to 10 times the program's) would measure the detector, so this controller is the
	// plain static build.
	c.bin = dynrunnerBin(t)
	c.start()
	before := procStatus(t, c.cmd.Process.Pid, "VmRSS")

	sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/exhaust.yml", `name: exhaust
on: [push]
jobs:
  exhaust:
    runs-on: [self-hosted, pod]
    steps:
      - run: |
          facade=$(tr '\0' '\n' </proc/1/environ | sed -n 's/^DYNRUNNER_FACADE_URL=//p')
          s=/run/dynrunner/secrets
          [[ -n $facade && -r $s/svid.pem ]] || { echo "no facade or SVID to try"; exit 1; }
          ping=$facade/api/actions/ping.v1.PingService/Ping
          c() { curl -sS -k --cert $s/svid.pem --key $s/svid_key.pem -H 'Content-Type: application/proto' -o /dev/null -w '%{http_code}' "$@" "$ping"; }
          head -c 268435456 /dev/zero | gzip -9 > bomb.gz
          echo "bomb of $(stat -c %s bomb.gz) bytes"
          echo "gzip bomb: $(c -H 'Content-Encoding: gzip' --data-binary @bomb.gz || true)"
          head -c 104857600 /dev/zero > big
          echo "plain 100 MB: $(c --data-binary @big || true)"
          head -c 1048576 /dev/zero > slow
          start=$(date +%s)
          for i in 1 2 3 4; do
            (code=$(c --limit-rate 1k --data-binary @slow || true); echo "slow $i: $code after $(( $(date +%s) - start )) seconds") &
          done
          fifth=
          for i in $(seq 1 60); do fifth=$(c --data-binary x || true); [[ $fifth == 429 ]] && break; sleep 0.5; done
          echo "fifth: $fifth"
          wait
          echo "attack over"
`)
	require.NoError(t, err)
	run := waitRun(t, f, repo, sha, 8*time.Minute)
	require.Len(t, run.Jobs, 1)
	jlog, err := f.JobLog(ctx, repo, run.Jobs[0].ID)
	require.NoError(t, err)
	nlog := devforge.NormalizeLog(jlog)
	require.Equal(t, "success", run.Jobs[0].Conclusion, tail(nlog, 40))
	require.Contains(t, nlog, "attack over", tail(nlog, 40))

	m := regexp.MustCompile(`(?m)^bomb of (\d+) bytes`).FindStringSubmatch(nlog)
	require.NotNil(t, m, tail(nlog, 40))
	size, _ := strconv.Atoi(m[1])
	assert.Less(t, size, 300<<10, "the bomb is a small body")
	assert.Regexp(t, `(?m)^gzip bomb: 4\d\d$`, nlog, "the gzip bomb was not refused")
	assert.Regexp(t, `(?m)^plain 100 MB: (4\d\d|000)$`, nlog, "the 100 MB body was not refused")
	assert.Regexp(t, `(?m)^fifth: 429$`, nlog, "a fifth request in flight was not refused")
	slow := regexp.MustCompile(`(?m)^slow \d: (\d+) after (\d+) seconds$`).FindAllStringSubmatch(nlog, -1)
	require.Len(t, slow, 4, tail(nlog, 40))
	for _, s := range slow {
		assert.NotEqual(t, "200", s[1], "a trickling body was answered")
		secs, _ := strconv.Atoi(s[2])
		assert.Less(t, secs, 150, "a trickling body was not cut off by the read timeout (1 MiB at 1 KiB/s takes 1,000 s)")
	}

	peak := procStatus(t, c.cmd.Process.Pid, "VmHWM")
	t.Logf("controller RSS %d MiB before the attack, peak %d MiB", before>>20, peak>>20)
	assert.Less(t, peak, before+256<<20, "the controller's memory grew by more than 256 MiB under the attack")
	assertNoContainers(t)
}

// procStatus reads a size field of /proc/<pid>/status, in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	require.Failf(t, "field missing", "no %s in /proc/%d/status", field, pid)
	return 0
}
