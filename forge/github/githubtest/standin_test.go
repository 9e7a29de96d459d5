package githubtest_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/forge/github/githubtest/standin"
)

// standInBinary is the stand-in runner, built once per test binary into a directory TestMain
// removes.
var standInBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if standInBinary.dir != "" {
		_ = os.RemoveAll(standInBinary.dir)
	}
	os.Exit(code)
}

// buildStandIn builds standinrunner with the go command, once.
func buildStandIn(t *testing.T) string {
	t.Helper()
	b := &standInBinary
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "standinrunner-")
		if b.err == nil {
			b.path, b.err = githubtest.BuildStandInRunner(b.dir)
		}
	})
	if errors.Is(b.err, githubtest.ErrNoGoCommand) {
		t.Skip(b.err)
	}
	require.NoError(t, b.err)
	return b.path
}

// standInProcess is one run of the stand-in runner.
type standInProcess struct {
	cmd            *exec.Cmd
	dir            string
	stdout, stderr bytes.Buffer
	done           chan error
}

// startStandIn runs the stand-in with args in a new directory, with env added to the test's.
func startStandIn(ctx context.Context, t *testing.T, env []string, args ...string) *standInProcess {
	t.Helper()
	p := &standInProcess{dir: t.TempDir(), done: make(chan error, 1)}
	cmd := exec.CommandContext(ctx, buildStandIn(t), args...)
	p.cmd = cmd
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	require.NoError(t, cmd.Start())
	go func() { p.done <- cmd.Wait() }()
	return p
}

// wait returns the process's exit status; its output may be read after.
func (p *standInProcess) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-p.done:
		if err == nil {
			return 0
		}
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		require.True(t, exit.Exited(), "the stand-in exited by itself, not by a signal: %v; stderr:\n%s", err, p.stderr.String())
		return exit.ExitCode()
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the stand-in runner did not exit")
		return -1
	}
}

// runStandIn runs the stand-in to its end.
func runStandIn(ctx context.Context, t *testing.T, env []string, args ...string) (*standInProcess, int) {
	t.Helper()
	p := startStandIn(ctx, t, env, args...)
	return p, p.wait(t)
}

// scaleSetWithSession creates the pod scale set and opens its message session.
func scaleSetWithSession(ctx context.Context, t *testing.T, c *scaleset.Client) (*scaleset.RunnerScaleSet, *scaleset.MessageSessionClient) {
	t.Helper()
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(context.WithoutCancel(ctx)) })
	return set, sess
}

// queueAcquired queues a job for the pod labels and acquires it through the session.
func queueAcquired(ctx context.Context, t *testing.T, srv *githubtest.Server, sess *scaleset.MessageSessionClient, spec githubtest.JobSpec) int64 {
	t.Helper()
	spec.Labels = podLabels
	id, err := srv.QueueJob(spec)
	require.NoError(t, err)
	got, err := sess.AcquireJobs(ctx, []int64{id})
	require.NoError(t, err)
	require.Equal(t, []int64{id}, got)
	return id
}

// jitConfig registers runner name of set through the unmodified client.
func jitConfig(ctx context.Context, t *testing.T, c *scaleset.Client, setID int, name string) *scaleset.RunnerScaleSetJitRunnerConfig {
	t.Helper()
	jit, err := c.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: name, WorkFolder: "_work"}, setID)
	require.NoError(t, err)
	return jit
}

// jobMessages reads the session's messages until it has seen JobStarted and JobCompleted of job.
func jobMessages(ctx context.Context, t *testing.T, sess *scaleset.MessageSessionClient, job int64) (*scaleset.JobStarted, *scaleset.JobCompleted) {
	t.Helper()
	var started *scaleset.JobStarted
	var completed *scaleset.JobCompleted
	last := 0
	for started == nil || completed == nil {
		msg := nextMessage(ctx, t, sess, last)
		last = msg.MessageID
		for _, m := range msg.JobStartedMessages {
			if m.RunnerRequestID == job {
				started = m
			}
		}
		for _, m := range msg.JobCompletedMessages {
			if m.RunnerRequestID == job {
				completed = m
			}
		}
	}
	return started, completed
}

// TestStandInRunsAJob runs the stand-in runner over HTTPS with a JIT configuration from the
// unmodified client: it waits for a job, takes the one assigned to its scale set, runs its
// script with the runner's variables, reports it, and its configuration cannot be used again.
func TestStandInRunsAJob(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.TLS = true })
	c := appClient(t, srv, scaleset.WithRootCAs(srv.RootCAs()))
	set, sess := scaleSetWithSession(ctx, t, c)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, srv.CertificatePEM(), 0o600))
	env := []string{"STANDIN_RUNNER_CA_FILE=" + caFile}

	jobID := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{DisplayName: "build", Run: `
echo "repo=$GITHUB_REPOSITORY owner=$GITHUB_REPOSITORY_OWNER run=$GITHUB_RUN_ID runner=$RUNNER_NAME actions=$GITHUB_ACTIONS ci=$CI"
echo "workspace=$GITHUB_WORKSPACE"
test "$(pwd -P)" = "$(cd "$GITHUB_WORKSPACE" && pwd -P)" && echo "runs in its workspace"
echo to-stderr >&2`})
	jit := jitConfig(ctx, t, c, set.ID, "slot-1")

	p := startStandIn(ctx, t, env, "run", "--jitconfig", jit.EncodedJITConfig)
	require.Eventually(t, func() bool { return srv.Requests(githubtest.OpStandInTakeJob) >= 1 }, 10*time.Second, 5*time.Millisecond,
		"the stand-in polls for a job")
	job, err := srv.Job(jobID)
	require.NoError(t, err)
	require.Equal(t, githubtest.JobAcquired, job.State, "a job not yet assigned is not taken")
	require.NoError(t, srv.AssignJob(jobID))
	require.Zero(t, p.wait(t), "stderr:\n%s", p.stderr.String())

	job, err = srv.Job(jobID)
	require.NoError(t, err)
	assert.Equal(t, githubtest.JobCompleted, job.State)
	assert.Equal(t, standin.ResultSucceeded, job.Result)
	assert.Equal(t, jit.Runner.ID, job.RunnerID)
	assert.Equal(t, "slot-1", job.RunnerName)

	workspace := filepath.Join(p.dir, "_work", "hello", "hello")
	assert.DirExists(t, workspace, "the work folder is under the working directory")
	log, err := srv.JobLog(jobID)
	require.NoError(t, err)
	for _, want := range []string{
		"repo=octo/hello owner=octo run=" + strconv.FormatInt(1000+jobID, 10) + " runner=slot-1 actions=true ci=true\n",
		"workspace=" + workspace + "\n", "runs in its workspace\n", "to-stderr\n",
	} {
		assert.Contains(t, log, want)
		assert.Contains(t, p.stdout.String(), want, "the step's output streams to stdout")
	}
	assert.Contains(t, p.stderr.String(), `job "build" completed with result: succeeded`)

	started, completed := jobMessages(ctx, t, sess, jobID)
	assert.Equal(t, jit.Runner.ID, started.RunnerID)
	assert.Equal(t, "slot-1", started.RunnerName)
	assert.Equal(t, jit.Runner.ID, completed.RunnerID)
	assert.Equal(t, "slot-1", completed.RunnerName)
	assert.Equal(t, standin.ResultSucceeded, completed.Result)

	assert.Empty(t, srv.Runners(), "the single-use runner is gone")
	_, err = c.GetRunner(ctx, jit.Runner.ID)
	require.ErrorIs(t, err, scaleset.RunnerNotFoundError)

	// The same JIT configuration again, with another job waiting: refused, as single-use.
	other := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{})
	require.NoError(t, srv.AssignJob(other))
	again, code := runStandIn(ctx, t, env, "run", "--jitconfig", jit.EncodedJITConfig)
	assert.Equal(t, 1, code)
	assert.Contains(t, again.stderr.String(), "409")
	assert.Contains(t, again.stderr.String(), "single-use")
	job, err = srv.Job(other)
	require.NoError(t, err)
	assert.Equal(t, githubtest.JobAssigned, job.State, "the used runner took nothing")
}

// TestStandInResults shows a failing script reported failed and an empty one succeeded, the
// stand-in exiting 0 after either.
func TestStandInResults(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set, sess := scaleSetWithSession(ctx, t, c)

	for _, tc := range []struct {
		name   string
		run    string
		result string
		logHas []string
	}{
		{"failing script", "echo doomed; exit 3", standin.ResultFailed, []string{"doomed\n", "exit status 3"}},
		{"no script", "", standin.ResultSucceeded, nil},
		{"long output", "head -c 300000 /dev/zero | tr '\\0' x", standin.ResultSucceeded, []string{"[standinrunner: log cut at 262144 bytes, 37856 more not kept]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jobID := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{Run: tc.run})
			require.NoError(t, srv.AssignJob(jobID))
			jit := jitConfig(ctx, t, c, set.ID, "slot-"+strings.ReplaceAll(tc.name, " ", "-"))
			p, code := runStandIn(ctx, t, nil, "--jitconfig", jit.EncodedJITConfig)
			require.Zero(t, code, "stderr:\n%s", p.stderr.String())
			job, err := srv.Job(jobID)
			require.NoError(t, err)
			assert.Equal(t, githubtest.JobCompleted, job.State)
			assert.Equal(t, tc.result, job.Result)
			log, err := srv.JobLog(jobID)
			require.NoError(t, err)
			for _, want := range tc.logHas {
				assert.Contains(t, log, want)
			}
			assert.LessOrEqual(t, len(log), standin.MaxLogBytes+100, "the log is bounded")
			_, completed := jobMessages(ctx, t, sess, jobID)
			assert.Equal(t, tc.result, completed.Result)
		})
	}
	assert.Empty(t, srv.Runners())
}

// TestStandInRefusedCredential shows a JIT configuration with a forged credential, or naming a
// runner that does not exist, refused: the stand-in exits 1 saying why and takes no job.
func TestStandInRefusedCredential(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set, sess := scaleSetWithSession(ctx, t, c)
	jobID := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{Run: "echo should not run"})
	require.NoError(t, srv.AssignJob(jobID))
	jit := jitConfig(ctx, t, c, set.ID, "slot-1")
	cfg, err := githubtest.DecodeJITConfig(jit.EncodedJITConfig)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		mod    func(*standin.JITConfig)
		status string
		says   string
	}{
		{"forged credential", func(c *standin.JITConfig) { c.Credential = "runner_forged" }, "401", "credential"},
		{"unknown runner", func(c *standin.JITConfig) { c.AgentID = 999 }, "404", "no runner 999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forged := cfg
			tc.mod(&forged)
			enc, err := standin.EncodeJITConfig(forged, "")
			require.NoError(t, err)
			rejected := srv.Counts().RejectedAuth
			p, code := runStandIn(ctx, t, nil, "--jitconfig", enc)
			assert.Equal(t, 1, code)
			assert.Contains(t, p.stderr.String(), "standinrunner: standin: take a job as runner")
			assert.Contains(t, p.stderr.String(), tc.status)
			assert.Contains(t, p.stderr.String(), tc.says)
			if tc.status == "401" {
				assert.Equal(t, rejected+1, srv.Counts().RejectedAuth)
			}
		})
	}
	job, err := srv.Job(jobID)
	require.NoError(t, err)
	assert.Equal(t, githubtest.JobAssigned, job.State, "no job was taken")
	assert.Equal(t, []githubtest.Runner{{ID: jit.Runner.ID, Name: "slot-1", ScaleSetID: set.ID}}, srv.Runners(), "the runner is still idle")
}

// TestStandInCommandLine shows a malformed command line or JIT configuration refused with exit
// status 2 and a clear message, and an https server without a CA file refused with 1.
func TestStandInCommandLine(t *testing.T) {
	ctx := testContext(t)
	encode := func(files string) string { return base64.StdEncoding.EncodeToString([]byte(files)) }
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"no jitconfig", []string{"run"}, "ACTIONS_RUNNER_INPUT_JITCONFIG is required"},
		{"not base64", []string{"run", "--jitconfig", "not base64!"}, "--jitconfig: standin: decode JIT config: malformed JIT configuration: not base64"},
		{"not files", []string{"--jitconfig", encode("[1]")}, "not a JSON object of files"},
		{"no .runner", []string{"--jitconfig", encode(`{".credentials":"e30="}`)}, "no file .runner"},
		{"no credential", []string{"--jitconfig", encode(`{".runner":"` + encode(`{"AgentId":1,"ServerUrl":"http://127.0.0.1:1/"}`) + `",".credentials":"e30="}`)}, ".credentials has no clientId"},
		{"unknown flag", []string{"run", "--url", "x"}, "flag provided but not defined: -url"},
		{"extra argument", []string{"run", "--jitconfig", "e30=", "more"}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, code := runStandIn(ctx, t, nil, tc.args...)
			assert.Equal(t, 2, code)
			assert.Contains(t, p.stderr.String(), tc.says)
		})
	}

	t.Run("https without CA file", func(t *testing.T) {
		enc, err := standin.EncodeJITConfig(standin.JITConfig{AgentID: 1, ServerURL: "https://127.0.0.1:1/tenant/", Credential: "runner_x"}, "")
		require.NoError(t, err)
		p, code := runStandIn(ctx, t, []string{"STANDIN_RUNNER_CA_FILE="}, "--jitconfig", enc)
		assert.Equal(t, 1, code)
		assert.Contains(t, p.stderr.String(), "set STANDIN_RUNNER_CA_FILE")
	})
}

// TestStandInUntrustedServer shows the stand-in refusing a server whose certificate its CA file
// does not hold, at once and without retrying.
func TestStandInUntrustedServer(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.TLS = true })
	c := appClient(t, srv, scaleset.WithRootCAs(srv.RootCAs()))
	set := podScaleSet(ctx, t, c)
	jit := jitConfig(ctx, t, c, set.ID, "slot-1")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, otherCA(t), 0o600))
	p, code := runStandIn(ctx, t, []string{"STANDIN_RUNNER_CA_FILE=" + caFile}, "--jitconfig", jit.EncodedJITConfig)
	assert.Equal(t, 1, code)
	assert.Contains(t, p.stderr.String(), "certificate")
	assert.NotContains(t, p.stderr.String(), "retrying")
	assert.Zero(t, srv.Requests(githubtest.OpStandInTakeJob))
}

// TestStandInRetriesTransientErrors shows a 5xx on either call retried, and a completion that
// keeps failing given up after a bounded number of attempts.
func TestStandInRetriesTransientErrors(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set, sess := scaleSetWithSession(ctx, t, c)

	jobID := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{Run: "echo once"})
	require.NoError(t, srv.AssignJob(jobID))
	srv.FailOnce(githubtest.OpStandInTakeJob, 503)
	srv.FailOnce(githubtest.OpStandInComplete, 502)
	jit := jitConfig(ctx, t, c, set.ID, "slot-1")
	p, code := runStandIn(ctx, t, nil, "--jitconfig", jit.EncodedJITConfig)
	require.Zero(t, code, "stderr:\n%s", p.stderr.String())
	assert.Contains(t, p.stderr.String(), "retrying")
	assert.Equal(t, 2, srv.Requests(githubtest.OpStandInComplete))
	job, err := srv.Job(jobID)
	require.NoError(t, err)
	assert.Equal(t, standin.ResultSucceeded, job.Result)

	jobID = queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{})
	require.NoError(t, srv.AssignJob(jobID))
	for range 10 {
		srv.FailOnce(githubtest.OpStandInComplete, 503)
	}
	jit = jitConfig(ctx, t, c, set.ID, "slot-2")
	before := srv.Requests(githubtest.OpStandInComplete)
	p, code = runStandIn(ctx, t, nil, "--jitconfig", jit.EncodedJITConfig)
	assert.Equal(t, 1, code)
	assert.Contains(t, p.stderr.String(), "503")
	assert.Contains(t, p.stderr.String(), "gave up after 5 attempts")
	assert.Equal(t, 5, srv.Requests(githubtest.OpStandInComplete)-before, "five attempts, then it gives up")
}

// TestStandInProtocolRefuses calls the stand-in protocol directly as an attacker would: another
// runner's credential, another runner's job, a second take, an unknown result, an oversize body.
func TestStandInProtocolRefuses(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set, sess := scaleSetWithSession(ctx, t, c)
	jobID := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{Run: "true"})
	require.NoError(t, srv.AssignJob(jobID))
	decode := func(name string) standin.JITConfig {
		cfg, err := githubtest.DecodeJITConfig(jitConfig(ctx, t, c, set.ID, name).EncodedJITConfig)
		require.NoError(t, err)
		return cfg
	}
	a, b := decode("slot-a"), decode("slot-b")
	postAs := func(u, authorization, body string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", authorization)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(out)
	}
	post := func(u, credential, body string) (int, string) { return postAs(u, "Bearer "+credential, body) }
	take := func(cfg standin.JITConfig) string {
		u, err := standin.TakeJobURL(cfg.ServerURL, cfg.AgentID)
		require.NoError(t, err)
		return u
	}
	complete := func(cfg standin.JITConfig, job int64) string {
		u, err := standin.CompleteURL(cfg.ServerURL, cfg.AgentID, job)
		require.NoError(t, err)
		return u
	}

	status, _ := post(take(a), b.Credential, "")
	assert.Equal(t, http.StatusUnauthorized, status, "another runner's credential")
	status, _ = post(take(a), "", "")
	assert.Equal(t, http.StatusUnauthorized, status, "no credential")
	status, _ = postAs(take(a), a.Credential, "")
	assert.Equal(t, http.StatusUnauthorized, status, "the credential without the Bearer scheme")
	status, body := post(take(a), a.Credential, "")
	require.Equal(t, http.StatusOK, status, body)
	var got standin.Job
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	assert.Equal(t, jobID, got.RunnerRequestID)
	assert.Equal(t, "octo/hello", got.Repository)
	assert.Equal(t, "true", got.Run)
	status, _ = post(take(a), a.Credential, "")
	assert.Equal(t, http.StatusConflict, status, "a runner takes one job")

	done := `{"result":"succeeded","log":"ok"}`
	status, _ = post(complete(b, jobID), b.Credential, done)
	assert.Equal(t, http.StatusConflict, status, "another runner's job")
	status, _ = post(complete(a, jobID), b.Credential, done)
	assert.Equal(t, http.StatusUnauthorized, status)
	status, _ = post(complete(a, jobID), a.Credential, `{"result":"great"}`)
	assert.Equal(t, http.StatusBadRequest, status, "an unknown result")
	status, _ = post(complete(a, jobID), a.Credential, `{"result":"succeeded","log":"`+strings.Repeat("x", standin.MaxCompletionBytes)+`"}`)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	job, err := srv.Job(jobID)
	require.NoError(t, err)
	assert.Equal(t, githubtest.JobRunning, job.State, "nothing refused changed the job")

	status, _ = post(complete(a, jobID), a.Credential, done)
	assert.Equal(t, http.StatusOK, status)
	status, _ = post(complete(a, jobID), a.Credential, done)
	assert.Equal(t, http.StatusOK, status, "a retried completion is answered again")
	status, _ = post(complete(a, jobID), a.Credential, `{"result":"failed","log":"ok"}`)
	assert.Equal(t, http.StatusConflict, status, "a different completion of a completed job")
	log, err := srv.JobLog(jobID)
	require.NoError(t, err)
	assert.Equal(t, "ok", log)
	status, _ = post(take(a), a.Credential, "")
	assert.Equal(t, http.StatusConflict, status, "a runner that ran its job takes no other")
	status, _ = post(take(standin.JITConfig{ServerURL: a.ServerURL, AgentID: 999}), a.Credential, "")
	assert.Equal(t, http.StatusNotFound, status)
}

// otherCA is a self-signed CA certificate, PEM-encoded, that signed none of the fake's.
func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "not the fake's CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestStandInCanceled shows a job ended under the stand-in: by a signal to the runner, which
// kills the step and reports the job canceled, and by the test through the Go API, after which
// the runner's report is refused.
func TestStandInCanceled(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set, sess := scaleSetWithSession(ctx, t, c)
	running := func(job int64) func() bool {
		return func() bool { j, err := srv.Job(job); return err == nil && j.State == githubtest.JobRunning }
	}

	t.Run("signal", func(t *testing.T) {
		jobID := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{Run: "touch started; sleep 60"})
		require.NoError(t, srv.AssignJob(jobID))
		jit := jitConfig(ctx, t, c, set.ID, "slot-signal")
		p := startStandIn(ctx, t, nil, "--jitconfig", jit.EncodedJITConfig)
		started := filepath.Join(p.dir, "_work", "hello", "hello", "started")
		require.Eventually(t, func() bool { _, err := os.Stat(started); return err == nil }, 10*time.Second, 5*time.Millisecond,
			"the step runs")
		began := time.Now()
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		assert.Equal(t, 1, p.wait(t))
		assert.Less(t, time.Since(began), 5*time.Second, "the step is killed, not waited for")
		assert.Contains(t, p.stderr.String(), "context canceled")
		job, err := srv.Job(jobID)
		require.NoError(t, err)
		assert.Equal(t, githubtest.JobCompleted, job.State)
		assert.Equal(t, standin.ResultCanceled, job.Result)
	})

	t.Run("runner removed while waiting", func(t *testing.T) {
		jit := jitConfig(ctx, t, c, set.ID, "slot-removed")
		p := startStandIn(ctx, t, nil, "--jitconfig", jit.EncodedJITConfig)
		before := srv.Requests(githubtest.OpStandInTakeJob)
		require.Eventually(t, func() bool { return srv.Requests(githubtest.OpStandInTakeJob) > before }, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, c.RemoveRunner(ctx, int64(jit.Runner.ID)), "cleanup removes an idle runner by id")
		assert.Equal(t, 1, p.wait(t))
		assert.Contains(t, p.stderr.String(), "404")
		assert.Contains(t, p.stderr.String(), "removed")
	})

	t.Run("go api", func(t *testing.T) {
		jobID := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{Run: "for i in $(seq 400); do [ -e go ] && exit 0; sleep 0.05; done; exit 1"})
		require.NoError(t, srv.AssignJob(jobID))
		jit := jitConfig(ctx, t, c, set.ID, "slot-api")
		p := startStandIn(ctx, t, nil, "--jitconfig", jit.EncodedJITConfig)
		require.Eventually(t, running(jobID), 10*time.Second, 5*time.Millisecond)
		require.NoError(t, srv.CompleteJob(jobID, standin.ResultCanceled))
		// The workspace exists once the job runs; the script ends when "go" appears in it.
		workspace := filepath.Join(p.dir, "_work", "hello", "hello")
		require.Eventually(t, func() bool { _, err := os.Stat(workspace); return err == nil }, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, os.WriteFile(filepath.Join(workspace, "go"), nil, 0o600))
		assert.Equal(t, 1, p.wait(t))
		assert.Contains(t, p.stderr.String(), "409")
		assert.Contains(t, p.stderr.String(), "already completed with result canceled")
		job, err := srv.Job(jobID)
		require.NoError(t, err)
		assert.Equal(t, standin.ResultCanceled, job.Result, "the test's completion stands")
	})
	assert.Empty(t, srv.Runners())
}

// TestStandInTakesItsConfigurationFromTheEnvironment: as the real runner, the stand-in reads
// ACTIONS_RUNNER_INPUT_JITCONFIG when --jitconfig is not given, and does not pass it on to the
// job's step.
func TestStandInTakesItsConfigurationFromTheEnvironment(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.AssignOnAcquire = true })
	c := appClient(t, srv)
	set, sess := scaleSetWithSession(ctx, t, c)
	jobID := queueAcquired(ctx, t, srv, sess, githubtest.JobSpec{Run: `echo "jit=[${ACTIONS_RUNNER_INPUT_JITCONFIG:-}]"`})
	jit := jitConfig(ctx, t, c, set.ID, "slot-env")
	p, code := runStandIn(ctx, t, []string{"ACTIONS_RUNNER_INPUT_JITCONFIG=" + jit.EncodedJITConfig})
	require.Zero(t, code, "stderr:\n%s", p.stderr.String())
	log, err := srv.JobLog(jobID)
	require.NoError(t, err)
	assert.Contains(t, log, "jit=[]", "the job's step was handed its runner's JIT configuration")
}
