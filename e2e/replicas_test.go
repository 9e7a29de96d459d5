package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/dynrunner/dynrunner/forge/gitea"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// recordingProxy stands in front of Gitea's runner API for one scheduler and records the
// state reports (UpdateTask) it forwards. It holds every final result for slowReport before
// forwarding it, as a slow Gitea would: long enough for another scheduler's reconcile pass
// (every second) to find the assignment still failed and not yet closed.
type recordingProxy struct {
	srv        *httptest.Server
	slowReport time.Duration

	mu         sync.Mutex
	keepalives map[int64]int // state reports without a result, by task
	results    map[int64]int // state reports with a final result, by task
	errs       []string
}

func newRecordingProxy(t *testing.T, upstream string, slowReport time.Duration) *recordingProxy {
	t.Helper()
	u, err := url.Parse(upstream)
	require.NoError(t, err)
	p := &recordingProxy{slowReport: slowReport, keepalives: map[int64]int{}, results: map[int64]int{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/runner.v1.RunnerService/UpdateTask") {
			body, err := io.ReadAll(r.Body)
			if err == nil {
				r.Body = io.NopCloser(bytes.NewReader(body))
				p.record(r.Header.Get("Content-Type"), body)
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *recordingProxy) record(contentType string, body []byte) {
	var req runnerv1.UpdateTaskRequest
	if contentType != "application/proto" {
		p.mu.Lock()
		p.errs = append(p.errs, "UpdateTask with content type "+contentType)
		p.mu.Unlock()
		return
	}
	if err := proto.Unmarshal(body, &req); err != nil {
		p.mu.Lock()
		p.errs = append(p.errs, "UpdateTask body: "+err.Error())
		p.mu.Unlock()
		return
	}
	id := req.GetState().GetId()
	final := req.GetState().GetResult() != runnerv1.Result_RESULT_UNSPECIFIED
	p.mu.Lock()
	if final {
		p.results[id]++
	} else {
		p.keepalives[id]++
	}
	p.mu.Unlock()
	if final {
		time.Sleep(p.slowReport) // the slow Gitea this proxy plays
	}
}

// counts returns the reports recorded so far, summed over tasks.
func (p *recordingProxy) counts() (keepalives, results int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.keepalives {
		keepalives += n
	}
	for _, n := range p.results {
		results += n
	}
	return keepalives, results
}

// leaseHeld reads dynrunner_scheduler_reconcile_lease_held from a controller's /metrics.
func leaseHeld(t *testing.T, c *controller) bool {
	t.Helper()
	resp, err := http.Get(c.httpURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "dynrunner_scheduler_reconcile_lease_held "); ok {
			return strings.TrimSpace(v) == "1"
		}
	}
	require.Failf(t, "metric missing", "%s/metrics has no dynrunner_scheduler_reconcile_lease_held", c.httpURL)
	return false
}

// newScheduler prepares a controller process that runs only the scheduler, acting as the
// runner whose credentials are in secrets, talking to Gitea through forgeURL.
func newScheduler(t *testing.T, tools devforge.Tools, forgeURL, secrets string, extra ...string) *controller {
	t.Helper()
	dir := t.TempDir()
	httpPort := freePort(t)
	c := &controller{t: t, httpURL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), logPath: filepath.Join(dir, "controller.log")}
	c.env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"COMPONENTS=scheduler",
		"STATE_DIR=" + filepath.Join(dir, "state"),
		"GITEA_URL=" + forgeURL,
		"GITEA_RUNNER_UUID_FILE=" + filepath.Join(secrets, "runner-uuid"),
		"GITEA_RUNNER_TOKEN_FILE=" + filepath.Join(secrets, "runner-token"),
		"GITEA_RUNNER_BIN=" + tools.RunnerBin,
		"GITEA_RUNNER_SHA256=" + tools.RunnerSHA256,
		"GITEA_RUNNER_VERSION=" + tools.RunnerVersion,
		"TASK_ENCRYPTION_KEY_FILE=" + filepath.Join(secrets, "task.key"),
		"RUNNER_FACADE_CAPABILITY_KEY_FILE=" + filepath.Join(secrets, "capability.key"),
		fmt.Sprintf("HTTP_LISTEN=127.0.0.1:%d", httpPort),
		"FETCH_INTERVAL=300ms",
		leaseEnv, pickupEnv,
	}, extra...)
	t.Cleanup(func() {
		c.stop()
		raceCheck(t, "scheduler", c.logPath)
		if t.Failed() {
			if b, err := os.ReadFile(c.logPath); err == nil {
				t.Logf("scheduler log %s:\n%s", c.httpURL, tail(string(b), 80))
			}
		}
	})
	return c
}

// TestTwoSchedulersReportOneFailure: two scheduler processes run against one JetStream as one
// Gitea runner, each through its own recording proxy to the real Gitea. A job is claimed but
// no worker exists to run it, so its pickup deadline passes and the assignment fails. Gitea,
// slow to answer, receives exactly one failure report for it, and only the holder of the
// reconcile lease kept the task alive before.
func TestTwoSchedulersReportOneFailure(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	ctx := t.Context()

	// Both schedulers act as one registered runner and share the keys of the event log.
	secrets := filepath.Join(t.TempDir(), "secrets")
	require.NoError(t, os.MkdirAll(secrets, 0o700))
	tok, err := f.RunnerRegistrationToken(ctx, "")
	require.NoError(t, err)
	creds, err := gitea.Register(ctx, http.DefaultClient, f.URL(), tok, "dynrunner-replicas", []string{"self-hosted", "pod"}, "e2e")
	require.NoError(t, err)
	for name, data := range map[string]string{"runner-uuid": creds.UUID, "runner-token": creds.Token, "task.key": randomKey(t), "capability.key": randomKey(t)} {
		require.NoError(t, secretfile.WriteNew(filepath.Join(secrets, name), []byte(data)))
	}

	const slow = 3 * time.Second
	pa, pb := newRecordingProxy(t, f.URL(), slow), newRecordingProxy(t, f.URL(), slow)
	natsPort := freePort(t)
	// a embeds the NATS server; b connects to it as its operator user.
	a := newScheduler(t, tools, pa.srv.URL, secrets, fmt.Sprintf("NATS_EMBEDDED_LISTEN=127.0.0.1:%d", natsPort))
	a.start()
	b := newScheduler(t, tools, pb.srv.URL, secrets,
		fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", natsPort), "NATS_USER=dynrunner",
		"NATS_PASSWORD_FILE="+filepath.Join(stateDir(a), "nats.password"))
	b.start()
	require.Eventually(t, func() bool { return leaseHeld(t, a) != leaseHeld(t, b) }, time.Minute, 200*time.Millisecond,
		"not exactly one scheduler holds the reconcile lease")
	holder, other, hp, op := a, b, pa, pb
	if leaseHeld(t, b) {
		holder, other, hp, op = b, a, pb, pa
	}
	t.Logf("the reconcile lease is held by %s", holder.httpURL)

	repo, err := f.CreateRepo(ctx, "replicas")
	require.NoError(t, err)
	sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/e2e.yml",
		"name: orphan\non: [push]\njobs:\n  orphan:\n    runs-on: [self-hosted, pod]\n    steps:\n      - run: echo never runs\n")
	require.NoError(t, err)
	// No pod worker runs: the pickup deadline (PICKUP_SECS=60) fails the assignment.
	run := waitRun(t, f, repo, sha, 5*time.Minute)
	require.Len(t, run.Jobs, 1)
	assert.Equal(t, "failure", run.Jobs[0].Conclusion)
	log, err := f.JobLog(ctx, repo, run.Jobs[0].ID)
	require.NoError(t, err)
	assert.Contains(t, log, "PICKUP_SECS", "the job's log does not say why it failed")
	assert.Equal(t, 1, strings.Count(log, "dynrunner: the job failed"), "failure explanations in the job's log:\n%s", log)

	// Another scheduler's pass would have reported within a second of the first report; keep
	// watching for several such passes after the slow Gitea answered.
	deadline := time.Now().Add(slow + 5*time.Second)
	for time.Now().Before(deadline) {
		_, ra := hp.counts()
		_, rb := op.counts()
		require.LessOrEqual(t, ra+rb, 1, "Gitea received %d failure reports", ra+rb)
		time.Sleep(200 * time.Millisecond)
	}
	kh, rh := hp.counts()
	ko, ro := op.counts()
	assert.Equal(t, 1, rh+ro, "failure reports Gitea received")
	assert.Equal(t, 1, rh, "failure reports from the lease's holder")
	assert.Positive(t, kh, "keepalives from the lease's holder")
	assert.Zero(t, ko, "keepalives from the scheduler without the lease")
	for _, p := range []*recordingProxy{pa, pb} {
		p.mu.Lock()
		assert.Empty(t, p.errs, "reports the proxy could not read")
		p.mu.Unlock()
	}
	assert.True(t, leaseHeld(t, holder), "the lease moved during the test")
	assert.False(t, leaseHeld(t, other))
}

func randomKey(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// stateDir is a controller's STATE_DIR.
func stateDir(c *controller) string {
	for _, kv := range c.env {
		if v, ok := strings.CutPrefix(kv, "STATE_DIR="); ok {
			return v
		}
	}
	return ""
}
