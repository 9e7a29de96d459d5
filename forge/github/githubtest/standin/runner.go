package standin

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"time"
)

// ErrRefused: the fake answered a call with a client error (4xx): a wrong credential, a runner
// that does not exist, a JIT configuration used before. Retrying does not help.
var ErrRefused = errors.New("refused by the server")

// Defaults of Runner.
const (
	DefaultWorkFolder = "_work" // the real runner's default
	defaultAttempts   = 5
	defaultRetryWait  = 200 * time.Millisecond
	maxRetryWait      = 5 * time.Second
	// pollTimeout bounds one long poll; the fake answers 202 well before (50 s at most).
	pollTimeout = 2 * time.Minute
	callTimeout = 30 * time.Second
	// reportTimeout bounds reporting a job cancelled by ctx, after ctx has ended.
	reportTimeout = 30 * time.Second
)

// Runner takes one job as the runner of a JIT configuration, runs its step and reports the
// result: the stand-in for actions/runner, for tests only.
type Runner struct {
	Config JITConfig
	// Client makes the calls; nil means a client of http.DefaultTransport. For an https
	// ServerUrl give one whose RootCAs trust the fake's certificate.
	Client *http.Client
	// Dir is the directory a relative WorkFolder is under; empty means the working directory.
	Dir string
	// Env is the environment the step inherits, before the variables the runner sets.
	Env []string
	// Output receives the step's output (stdout and stderr) as it comes; nil discards it.
	Output io.Writer
	// Logf prints the runner's progress; nil prints nothing.
	Logf func(format string, args ...any)
	// Attempts bounds the tries of one call on transient errors; 0 means 5.
	Attempts int
	// RetryWait is the wait after the first transient error, doubled after each; 0 means 200 ms.
	RetryWait time.Duration
}

// Validate checks that cfg has what the stand-in needs. Errors wrap ErrJITConfig.
func Validate(cfg JITConfig) error {
	switch {
	case cfg.AgentID <= 0:
		return fmt.Errorf("standin: %w: .runner has no AgentId", ErrJITConfig)
	case cfg.Credential == "":
		return fmt.Errorf("standin: %w: .credentials has no clientId", ErrJITConfig)
	}
	u, err := url.Parse(cfg.ServerURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("standin: %w: .runner's ServerUrl %q is not an http(s) URL", ErrJITConfig, cfg.ServerURL)
	}
	return nil
}

// Run takes one job, waiting for one to be assigned to the runner's scale set, runs its step and
// reports the result, which it returns with the job. When ctx ends while the step runs, the step
// is killed, the job reported canceled, and ctx's error returned.
func (r *Runner) Run(ctx context.Context) (Job, string, error) {
	cfg := r.Config
	if err := Validate(cfg); err != nil {
		return Job{}, "", err
	}
	work := cfg.WorkFolder
	if work == "" {
		work = DefaultWorkFolder
	}
	if !filepath.IsAbs(work) {
		abs, err := filepath.Abs(filepath.Join(r.Dir, work))
		if err != nil {
			return Job{}, "", fmt.Errorf("standin: work folder: %w", err)
		}
		work = abs
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return Job{}, "", fmt.Errorf("standin: create work folder: %w", err)
	}
	r.logf("runner %s (id %d) listening for a job at %s", cfg.AgentName, cfg.AgentID, cfg.ServerURL)
	job, err := r.takeJob(ctx)
	if err != nil {
		return Job{}, "", err
	}
	r.logf("running job %q (request %d) of %s", job.DisplayName, job.RunnerRequestID, job.Repository)
	result, log := r.runStep(ctx, job, work)
	reportCtx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		reportCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
		defer cancel()
	}
	if err := r.complete(reportCtx, job, Completion{Result: result, Log: log}); err != nil {
		return job, result, err
	}
	r.logf("job %q completed with result: %s", job.DisplayName, result)
	return job, result, ctx.Err()
}

func (r *Runner) takeJob(ctx context.Context) (Job, error) {
	u, err := TakeJobURL(r.Config.ServerURL, r.Config.AgentID)
	if err != nil {
		return Job{}, err
	}
	for {
		status, body, err := r.call(ctx, u, nil, pollTimeout)
		if err != nil {
			return Job{}, fmt.Errorf("standin: take a job: %w", err)
		}
		switch status {
		case http.StatusAccepted:
			continue // the long poll timed out with no job: poll again
		case http.StatusOK:
			var job Job
			if err := json.Unmarshal(body, &job); err != nil {
				return Job{}, fmt.Errorf("standin: take a job: decode the answer: %w", err)
			}
			return job, nil
		default:
			return Job{}, fmt.Errorf("standin: take a job as runner %d: %w", r.Config.AgentID, refusal(status, body))
		}
	}
}

func (r *Runner) complete(ctx context.Context, job Job, c Completion) error {
	u, err := CompleteURL(r.Config.ServerURL, r.Config.AgentID, job.RunnerRequestID)
	if err != nil {
		return err
	}
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("standin: encode completion: %w", err)
	}
	status, answer, err := r.call(ctx, u, body, callTimeout)
	if err != nil {
		return fmt.Errorf("standin: report job %d %s: %w", job.RunnerRequestID, c.Result, err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("standin: report job %d %s: %w", job.RunnerRequestID, c.Result, refusal(status, answer))
	}
	return nil
}

// refusal describes an answer other than the ones a call expects.
func refusal(status int, body []byte) error {
	var e struct {
		Message string `json:"message"`
	}
	msg := string(body)
	if json.Unmarshal(body, &e) == nil && e.Message != "" {
		msg = e.Message
	}
	if status >= 400 && status < 500 {
		return fmt.Errorf("%w: %d %s: %s", ErrRefused, status, http.StatusText(status), msg)
	}
	return fmt.Errorf("unexpected answer %d %s: %s", status, http.StatusText(status), msg)
}

// call POSTs body to u with the runner's credential, retrying transient failures (network
// errors other than TLS verification, 429 and 5xx) a bounded number of times. It returns the
// answer's status and body, or an error if no answer came or the last one was still transient.
func (r *Runner) call(ctx context.Context, u string, body []byte, timeout time.Duration) (int, []byte, error) {
	attempts, wait := r.Attempts, r.RetryWait
	if attempts <= 0 {
		attempts = defaultAttempts
	}
	if wait <= 0 {
		wait = defaultRetryWait
	}
	for attempt := 1; ; attempt++ {
		status, answer, err := r.callOnce(ctx, u, body, timeout)
		var transient bool
		if err != nil {
			transient = ctx.Err() == nil && !permanent(err)
		} else {
			transient = status == http.StatusTooManyRequests || status >= 500
		}
		if transient && err == nil {
			err = refusal(status, answer)
		}
		if !transient || attempt >= attempts {
			if transient {
				err = fmt.Errorf("%w (gave up after %d attempts)", err, attempt)
			}
			return status, answer, err
		}
		r.logf("%v; retrying in %s", err, wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, maxRetryWait)
	}
}

func (r *Runner) callOnce(ctx context.Context, u string, body []byte, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+r.Config.Credential)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "dynrunner-standinrunner")
	client := r.Client
	if client == nil {
		client = &http.Client{}
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, answer, nil
}

// permanent reports whether a transport error will not go away by retrying: the server's
// certificate is not trusted, or it does not speak TLS.
func permanent(err error) bool {
	var verify *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	return errors.As(err, &verify) || errors.As(err, &record)
}

func (r *Runner) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

// runStep runs job.Run with sh -c in the job's workspace under work and returns the result and
// the log (the step's output, cut at MaxLogBytes).
func (r *Runner) runStep(ctx context.Context, job Job, work string) (string, string) {
	if job.Run == "" {
		return ResultSucceeded, ""
	}
	out := &stepOutput{dst: r.Output}
	name := path.Base(job.Repository)
	if name == "." || name == "/" || name == ".." {
		name = "repository"
	}
	workspace := filepath.Join(work, name, name)
	temp := filepath.Join(work, "_temp")
	for _, dir := range []string{workspace, temp} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintf(out, "standinrunner: create %s: %v\n", dir, err)
			return ResultFailed, out.String()
		}
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", job.Run)
	cmd.Dir = workspace
	cmd.Env = append(append([]string(nil), r.Env...), StepEnv(r.Config, job, workspace, temp)...)
	cmd.Stdout, cmd.Stderr = out, out
	ownProcessGroup(cmd)
	cmd.WaitDelay = 5 * time.Second // a child left holding the output does not hold the job
	err := cmd.Run()
	switch {
	case err == nil:
		return ResultSucceeded, out.String()
	case ctx.Err() != nil:
		fmt.Fprintf(out, "standinrunner: step canceled: %v\n", ctx.Err())
		return ResultCanceled, out.String()
	default:
		fmt.Fprintf(out, "standinrunner: step failed: %v\n", err)
		return ResultFailed, out.String()
	}
}

// StepEnv is the variables the stand-in sets for a step, as the real runner does.
func StepEnv(cfg JITConfig, job Job, workspace, temp string) []string {
	return []string{
		"CI=true",
		"GITHUB_ACTIONS=true",
		"GITHUB_SERVER_URL=" + cfg.GitHubURL,
		"GITHUB_REPOSITORY=" + job.Repository,
		"GITHUB_REPOSITORY_OWNER=" + job.Owner,
		"GITHUB_RUN_ID=" + strconv.FormatInt(job.WorkflowRunID, 10),
		"GITHUB_WORKFLOW_REF=" + job.WorkflowRef,
		"GITHUB_EVENT_NAME=" + job.EventName,
		"GITHUB_WORKSPACE=" + workspace,
		"RUNNER_NAME=" + cfg.AgentName,
		"RUNNER_TEMP=" + temp,
	}
}

// stepOutput copies a step's output to dst and keeps the first MaxLogBytes of it. exec calls
// Write from one goroutine at a time when Stdout and Stderr are the same *stepOutput.
type stepOutput struct {
	dst  io.Writer
	log  bytes.Buffer
	lost int
}

func (o *stepOutput) Write(p []byte) (int, error) {
	if o.dst != nil {
		_, _ = o.dst.Write(p) // the log is what counts; a closed stdout does not fail the job
	}
	keep := min(len(p), MaxLogBytes-o.log.Len())
	o.log.Write(p[:keep])
	o.lost += len(p) - keep
	return len(p), nil
}

func (o *stepOutput) String() string {
	if o.lost > 0 {
		return o.log.String() + fmt.Sprintf("\n[standinrunner: log cut at %d bytes, %d more not kept]\n", MaxLogBytes, o.lost)
	}
	return o.log.String()
}
