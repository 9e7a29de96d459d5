package executor

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	"github.com/rs/zerolog"

	dynrunnerv1 "github.com/dynrunner/dynrunner/proto/dynrunner/v1"
	"github.com/dynrunner/dynrunner/proto/dynrunner/v1/dynrunnerv1connect"
)

// RunConfig configures one executor run: the environment's Config and what the process that
// runs the job is handed beside it.
type RunConfig struct {
	Config
	// Token is the single-use capability token (a secret).
	Token string
	// TLS dials the facade: mTLS with the environment's SVID (workload.ClientTLSConfig), or
	// for a microVM guest server-authenticated TLS pinning the facade's CA and SPIFFE ID.
	TLS *tls.Config
	// Env is the environment the runner, and through it the job, starts from: the executor's
	// own (os.Environ, which only cmd reads). The executor's own settings (DYNRUNNER_*,
	// GITEA_RUNNER_*, ...) are removed from it.
	Env []string
	// Credential, when set, runs the runner (and so the job) as that user; the executor
	// hands it the work directory.
	Credential *syscall.Credential
	// Output receives the runner's own output.
	Output io.Writer
	Log    zerolog.Logger
}

// ErrRunnerMismatch: the runner binary (Gitea's, or GitHub's for a slot) is not the pinned one.
var ErrRunnerMismatch = errors.New("executor: runner binary does not match the pinned version")

// VerifyRunner checks the runner binary's SHA-256 and the version it reports.
func VerifyRunner(ctx context.Context, bin, wantSHA, wantVersion string) error {
	f, err := os.Open(bin)
	if err != nil {
		return fmt.Errorf("executor: runner binary: %w", err)
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return fmt.Errorf("executor: hash runner binary: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(got, wantSHA) {
		return fmt.Errorf("%w: %s has SHA-256 %s, pinned %s", ErrRunnerMismatch, bin, got, wantSHA)
	}
	if wantVersion != "" {
		out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
		if err != nil {
			return fmt.Errorf("executor: %s --version: %w", bin, err)
		}
		if !strings.Contains(string(out), strings.TrimPrefix(wantVersion, "v")) {
			return fmt.Errorf("%w: %s reports %q, pinned %s", ErrRunnerMismatch, bin, strings.TrimSpace(string(out)), wantVersion)
		}
	}
	return nil
}

// Run runs the environment's one job. It returns nil when the runner finished the job (its
// result, success or failure, is in the forge) and an error when it could not run it.
func Run(ctx context.Context, cfg RunConfig) error {
	log := cfg.Log
	if err := VerifyRunner(ctx, cfg.RunnerBin, cfg.RunnerSHA256, cfg.RunnerVersion); err != nil {
		return err
	}
	facades, err := ParseFacadeURLs(cfg.FacadeURL)
	if err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	// A facade host that dies without closing its connections is noticed by the HTTP/2
	// pings: a connection silent for SendPingTimeout is pinged and closed when the ping goes
	// unanswered, and the failover moves on.
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 15 * time.Second}
	transport := &http.Transport{
		TLSClientConfig:     cfg.TLS,
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: 15 * time.Second, PingTimeout: 10 * time.Second},
	}
	defer transport.CloseIdleConnections()
	failover, err := NewFailover(FailoverConfig{Facades: facades, Next: transport, Log: log})
	if err != nil {
		return err
	}
	// Requests name the first facade; the failover sends them to the current one.
	cfg.FacadeURL = facades[0]
	facade, _ := url.Parse(facades[0])
	var forge *url.URL
	if cfg.ForgeURL != "" {
		forge = cfg.ForgeURL.URL()
	}
	upstream := &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 16,
		IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 30 * time.Second}
	defer upstream.CloseIdleConnections()
	px, err := startProxy(proxyConfig{Facade: facade, FacadeTransport: failover, Forge: forge, Upstream: upstream, Log: log})
	if err != nil {
		return err
	}
	defer px.Close()
	plan, confPath, err := prepare(cfg, px)
	if err != nil {
		return err
	}
	// The executor redeems the token itself and writes the runner's registration file, so the
	// token never appears on a command line where other processes could read it.
	name := fmt.Sprintf("dynrunner-%d-%d", cfg.Task, cfg.Epoch)
	creds, err := register(ctx, failover, cfg, name, plan.address)
	if err != nil {
		return err
	}
	log.Info().Str("runner", name).Str("server_url", plan.address).Str("facade", failover.Current()).Msg("runner registered at the facade")
	if cfg.Credential != nil {
		if err := chownTree(cfg.WorkDir, int(cfg.Credential.Uid), int(cfg.Credential.Gid)); err != nil {
			return fmt.Errorf("executor: hand the work directory to the runner's user: %w", err)
		}
	}

	daemon := exec.Command(cfg.RunnerBin, "--config", confPath, "daemon")
	daemon.Dir = cfg.WorkDir
	daemon.Env = plan.env
	daemon.Stdout, daemon.Stderr = cfg.Output, cfg.Output
	daemon.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cfg.Credential}
	if err := daemon.Start(); err != nil {
		return fmt.Errorf("executor: start the runner: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- daemon.Wait() }()

	// Renewals carry the runner credentials Register returned: a guest without an SVID is
	// known to the facade by them.
	lease := dynrunnerv1connect.NewLeaseServiceClient(&http.Client{Transport: failover, Timeout: 30 * time.Second}, cfg.FacadeURL,
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("x-runner-uuid", creds.UUID)
				req.Header().Set("x-runner-token", creds.Token)
				return next(ctx, req)
			}
		})))
	// Renew at once (the lease has run since the claim), then every cfg.Renew; after a failed
	// renewal retry sooner, so a controller back from a restart hears from us within seconds.
	renew := time.NewTimer(0)
	defer renew.Stop()
	stop := func(why string) {
		log.Warn().Str("why", why).Msg("stopping the runner")
		_ = syscall.Kill(-daemon.Process.Pid, syscall.SIGTERM)
	}
	var stopOnce sync.Once
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("executor: runner exited: %w", err)
			}
			log.Info().Msg("runner finished its job")
			return nil
		case <-ctx.Done():
			stopOnce.Do(func() { stop("executor stopped") })
			ctx = context.WithoutCancel(ctx)
		case <-renew.C:
			rctx, cancel := context.WithTimeout(ctx, renewRetry)
			resp, err := lease.Renew(rctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: int64(cfg.Task), Epoch: uint64(cfg.Epoch)}))
			cancel()
			if err != nil {
				// The controller may be restarting; the lease outlasts a few missed renewals.
				log.Warn().Err(err).Dur("retry_in", renewRetry).Msg("lease renewal failed")
				if connect.CodeOf(err) == connect.CodeFailedPrecondition {
					stopOnce.Do(func() { stop("the facade refused the lease: " + err.Error()) })
				}
				renew.Reset(min(renewRetry, cfg.Renew))
				continue
			}
			renew.Reset(cfg.Renew)
			// The SVID is issued again with every renewal and lives no longer than the lease:
			// connections opened with an older one are closed once idle, so the next request
			// presents the current one.
			transport.CloseIdleConnections()
			if resp.Msg.GetEnded() {
				stopOnce.Do(func() { stop("the assignment ended") })
				continue
			}
			log.Debug().Time("lease_expires", resp.Msg.GetLeaseExpiresAt().AsTime()).Msg("lease renewed")
		}
	}
}

// prepare plans the runner's address and environment and writes its configuration into the
// work directory; it returns the plan and the configuration's path.
func prepare(cfg RunConfig, px *proxy) (runnerPlan, string, error) {
	plan := planRunner(cfg.ForgeURL, px, cfg.Env, filepath.Join(cfg.WorkDir, "home"))
	switch {
	case plan.forwarded && cfg.ForgeURL == "":
		cfg.Log.Warn().Str("server_url", plan.address).
			Msg("the assignment names no forge URL (claimed by an older release): its job sees the forwarder's URL as its server URL")
	case plan.forwarded:
		cfg.Log.Warn().Str("forge", cfg.ForgeURL.String()).Str("server_url", plan.address).
			Msg("the forge is on a loopback address, which the runner cannot reach through a proxy: its job sees the forwarder's URL as its server URL")
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return plan, "", fmt.Errorf("executor: work dir: %w", err)
	}
	if plan.home != "" {
		if err := os.MkdirAll(plan.home, 0o700); err != nil {
			return plan, "", fmt.Errorf("executor: home: %w", err)
		}
	}
	confPath := filepath.Join(cfg.WorkDir, "runner-config.yaml")
	if err := os.WriteFile(confPath, []byte(runnerConfig(cfg.WorkDir, plan)), 0o600); err != nil {
		return plan, "", fmt.Errorf("executor: runner config: %w", err)
	}
	return plan, confPath, nil
}

// renewRetry bounds one renewal call and is the pause before retrying a failed one.
const renewRetry = 5 * time.Second

// registerKeyHeader is facade.RegisterKeyHeader: the header that carries the secret an
// environment draws for its Register, by which the facade answers a Register sent again.
const registerKeyHeader = "x-dynrunner-register-key"

// registration is the Gitea runner's `.runner` file.
type registration struct {
	Warning   string   `json:"WARNING"`
	ID        int64    `json:"id"`
	UUID      string   `json:"uuid"`
	Name      string   `json:"name"`
	Token     string   `json:"token"`
	Address   string   `json:"address"`
	Labels    []string `json:"labels"`
	Ephemeral bool     `json:"ephemeral"`
}

// register redeems the capability token at the facade for an ephemeral runner and writes the
// runner's registration file (mode 0600) with address, the server URL its jobs see.
func register(ctx context.Context, transport http.RoundTripper, cfg RunConfig, name, address string) (registration, error) {
	client := runnerv1connect.NewRunnerServiceClient(&http.Client{Transport: transport, Timeout: 2 * time.Minute}, strings.TrimRight(cfg.FacadeURL, "/")+"/api/actions")
	names := make([]string, len(cfg.Labels))
	for i, l := range cfg.Labels {
		names[i], _, _ = strings.Cut(l, ":")
	}
	var resp *connect.Response[runnerv1.RegisterResponse]
	var err error
	// One key for every attempt: a Register sent again after its answer was lost (the facade
	// died mid-request) is answered again by whichever facade gets it.
	key := randomHex(32)
	// The facade may be restarting; a refused token is final.
	for attempt := range 30 {
		if attempt > 0 {
			t := time.NewTimer(2 * time.Second)
			select {
			case <-ctx.Done():
				t.Stop()
				return registration{}, ctx.Err()
			case <-t.C:
			}
		}
		req := connect.NewRequest(&runnerv1.RegisterRequest{
			Name: name, Token: cfg.Token, Version: "dynrunner-executor", Labels: names, Ephemeral: true,
		})
		req.Header().Set(registerKeyHeader, key)
		resp, err = client.Register(ctx, req)
		// The failover has tried every facade already when it gives up.
		if err == nil || connect.CodeOf(err) != connect.CodeUnavailable || errors.Is(err, ErrNoFacade) {
			break
		}
	}
	if err != nil {
		return registration{}, fmt.Errorf("executor: register the runner at the facade: %w", err)
	}
	r := resp.Msg.GetRunner()
	reg := registration{
		Warning: "written by dynrunner executor for one job", ID: r.GetId(), UUID: r.GetUuid(), Name: name,
		Token: r.GetToken(), Address: address, Labels: cfg.Labels, Ephemeral: true,
	}
	data, _ := json.MarshalIndent(reg, "", "  ")
	if err := os.WriteFile(filepath.Join(cfg.WorkDir, ".runner"), data, 0o600); err != nil {
		return registration{}, fmt.Errorf("executor: runner registration file: %w", err)
	}
	return reg, nil
}

// runnerConfig is the Gitea runner's configuration inside an environment: one job, host
// mode, everything under the work directory, generous final-report retries so a controller
// restart during the last flush loses nothing. The cache server is the runner's own, as on a
// static runner (empty in a fresh environment). runner.envs restores for the jobs what the
// runner's own environment changed (its proxy settings): the job sees the environment as it
// was.
func runnerConfig(dir string, plan runnerPlan) string {
	var envs strings.Builder
	if len(plan.jobEnv) > 0 {
		envs.WriteString("  envs:\n")
		for _, k := range slices.Sorted(maps.Keys(plan.jobEnv)) {
			fmt.Fprintf(&envs, "    %s: %s\n", strconv.Quote(k), strconv.Quote(plan.jobEnv[k]))
		}
	}
	return fmt.Sprintf(`log:
  level: info
runner:
  file: %[1]s/.runner
  capacity: 1
  timeout: 6h
  shutdown_timeout: 30s
  fetch_interval: 1s
  fetch_interval_max: 2s
  log_report_interval: 1s
  log_report_max_latency: 500ms
  state_report_interval: 2s
  report_close_timeout: 60s
  insecure: %[2]t
%[3]scache:
  enabled: true
  dir: %[1]s/cache
  host: 127.0.0.1
host:
  workdir_parent: %[1]s/host
`, dir, plan.insecure, envs.String())
}

// chownTree gives dir and everything below it to uid:gid, without following symbolic links.
func chownTree(dir string, uid, gid int) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
