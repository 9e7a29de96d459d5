package guest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"go.yaml.in/yaml/v3"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// Seed is what the NoCloud seed's meta-data tells the guest.
type Seed struct {
	InstanceID string `yaml:"instance-id"`
	Nonce      string `yaml:"dynrunner-nonce"`
	Endpoint   string `yaml:"dynrunner-endpoint"`
}

// ReadSeed reads meta-data from a mounted NoCloud seed directory.
func ReadSeed(dir string) (Seed, error) {
	data, err := os.ReadFile(filepath.Join(dir, "meta-data"))
	if err != nil {
		return Seed{}, fmt.Errorf("guest: seed: %w", err)
	}
	var s Seed
	if err := yaml.Unmarshal(data, &s); err != nil {
		return Seed{}, fmt.Errorf("guest: seed meta-data: %w", err)
	}
	u, err := url.Parse(s.Endpoint)
	if s.InstanceID == "" || s.Nonce == "" || err != nil || u.Scheme != "http" || u.Host == "" {
		return Seed{}, errors.New("guest: seed meta-data lacks instance-id, dynrunner-nonce or an http dynrunner-endpoint")
	}
	return s, nil
}

// Environment variables that seed a guest started by a sandbox API (OpenSandbox) instead of
// a NoCloud seed.
const (
	EnvInstanceID = "DYNRUNNER_INSTANCE_ID"
	EnvNonce      = "DYNRUNNER_NONCE"
	EnvEndpoint   = "DYNRUNNER_NONCE_ENDPOINT"
)

// SeedFromEnv reads the seed from the environment; ok is false when none is there.
func SeedFromEnv(getenv func(string) string) (Seed, bool, error) {
	s := Seed{InstanceID: getenv(EnvInstanceID), Nonce: getenv(EnvNonce), Endpoint: getenv(EnvEndpoint)}
	if s.Nonce == "" {
		return Seed{}, false, nil
	}
	if u, err := url.Parse(s.Endpoint); s.InstanceID == "" || err != nil || u.Scheme != "http" || u.Host == "" {
		return Seed{}, true, fmt.Errorf("guest: %s is set but %s or an http %s is missing", EnvNonce, EnvInstanceID, EnvEndpoint)
	}
	return s, true, nil
}

// Config configures one guest run.
type Config struct {
	// Seed, when set, is used instead of reading SeedDir.
	Seed    *Seed
	SeedDir string
	WorkDir string
	// User, when set, is the account the runner and the job run as (the guest image's
	// `runner`); the guest itself stays root to power the VM off.
	User string
	// Env is the guest's own environment (os.Environ, read in cmd), which the runner starts
	// from when User is empty.
	Env    []string
	Output io.Writer
	Log    zerolog.Logger
}

// Run redeems the seed's nonce and runs the assignment's one job: a Gitea assignment's with the
// Gitea runner through the facade (executor.Run), a GitHub slot's with GitHub's runner and the
// slot's JIT configuration (executor.RunGitHub).
func Run(ctx context.Context, cfg Config) error {
	j, err := prepare(ctx, &http.Client{Timeout: 2 * time.Minute}, cfg)
	if err != nil {
		return err
	}
	if j.github != nil {
		j.github.Log.Info().Str("runner", j.github.RunnerBin).Msg("nonce redeemed; running the GitHub Actions runner")
		return executor.RunGitHub(ctx, *j.github)
	}
	j.gitea.Log.Info().Str("facade", j.gitea.FacadeURL).Msg("nonce redeemed; running the job")
	return executor.Run(ctx, *j.gitea)
}

// job is what a redeemed grant has the guest run: a Gitea assignment's runner or a GitHub
// slot's, exactly one.
type job struct {
	gitea  *executor.RunConfig
	github *executor.GitHubRunConfig
}

// prepare redeems the seed's nonce and prepares the granted job.
func prepare(ctx context.Context, hc *http.Client, cfg Config) (job, error) {
	var seed Seed
	if cfg.Seed != nil {
		seed = *cfg.Seed
	} else {
		var err error
		if seed, err = ReadSeed(cfg.SeedDir); err != nil {
			return job{}, err
		}
	}
	grant, err := redeem(ctx, hc, seed)
	if err != nil {
		return job{}, err
	}
	if grant.IsGitHub() {
		rc, err := prepareGitHub(cfg, grant)
		if err != nil {
			return job{}, err
		}
		return job{github: &rc}, nil
	}
	rc, err := prepareGitea(ctx, hc, cfg, seed, grant)
	if err != nil {
		return job{}, err
	}
	return job{gitea: &rc}, nil
}

// prepareGitHub writes a GitHub slot's JIT configuration where executor.RunGitHub takes it
// from (a secrets directory only the guest reads; RunGitHub removes the file once read) and
// returns what RunGitHub is handed: GitHub's runner, which the guest image holds at the
// granted path and RunGitHub checks against the granted SHA-256, runs as the runner's user.
func prepareGitHub(cfg Config, grant executor.Grant) (executor.GitHubRunConfig, error) {
	gc, jit, err := grant.GitHubConfig()
	if err != nil {
		return executor.GitHubRunConfig{}, fmt.Errorf("guest: %w", err)
	}
	cred, env, err := runAs(cfg.User)
	if err != nil {
		return executor.GitHubRunConfig{}, err
	}
	if cred == nil {
		env = cfg.Env
	}
	// Traversable: the runner's user works below it (in job/, which becomes its own).
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return executor.GitHubRunConfig{}, fmt.Errorf("guest: work dir: %w", err)
	}
	gc.SecretsDir, gc.WorkDir = filepath.Join(cfg.WorkDir, "secrets"), filepath.Join(cfg.WorkDir, "job")
	if err := os.MkdirAll(gc.SecretsDir, 0o700); err != nil {
		return executor.GitHubRunConfig{}, fmt.Errorf("guest: secrets dir: %w", err)
	}
	if err := secretfile.WriteNew(filepath.Join(gc.SecretsDir, executor.JITConfigFile), []byte(jit)); err != nil {
		return executor.GitHubRunConfig{}, fmt.Errorf("guest: JIT configuration: %w", err)
	}
	gc.LogFormat = executor.DefaultLogFormat
	log := cfg.Log.With().Int64("task_id", grant.TaskID).Uint64("epoch", grant.Epoch).Logger()
	return executor.GitHubRunConfig{GitHubConfig: gc, Env: env, Credential: cred, Output: cfg.Output, Log: log}, nil
}

// prepareGitea downloads a Gitea assignment's granted runner into the work directory and
// returns what executor.Run is handed for the job.
func prepareGitea(ctx context.Context, hc *http.Client, cfg Config, seed Seed, grant executor.Grant) (executor.RunConfig, error) {
	ec, err := grant.Config()
	if err != nil {
		return executor.RunConfig{}, fmt.Errorf("guest: %w", err)
	}
	facadeID := ec.FacadeID
	bundle, err := x509bundle.Parse(facadeID.TrustDomain(), []byte(grant.FacadeCAPEM))
	if err != nil {
		return executor.RunConfig{}, fmt.Errorf("guest: facade CA: %w", err)
	}
	// Traversable: the runner's user works below it (in job/, which becomes its own).
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return executor.RunConfig{}, fmt.Errorf("guest: work dir: %w", err)
	}
	cred, env, err := runAs(cfg.User)
	if err != nil {
		return executor.RunConfig{}, err
	}
	if cred == nil {
		env = cfg.Env
	}
	bin := filepath.Join(cfg.WorkDir, "gitea-runner")
	if err := download(ctx, hc, strings.TrimRight(seed.Endpoint, "/")+grant.RunnerPath, bin, grant.RunnerSHA256); err != nil {
		return executor.RunConfig{}, err
	}
	log := cfg.Log.With().Int64("task_id", grant.TaskID).Uint64("epoch", grant.Epoch).Logger()
	ec.RunnerBin, ec.WorkDir = bin, filepath.Join(cfg.WorkDir, "job")
	return executor.RunConfig{
		Config: ec, Token: grant.Token, TLS: workload.GuestClientTLSConfig(bundle, facadeID),
		Credential: cred, Env: env, Output: cfg.Output, Log: log,
	}, nil
}

// runAs returns the credential and the environment of the runner's process for the account
// name: what a login of that user would have. With no name the runner runs as the guest.
func runAs(name string) (*syscall.Credential, []string, error) {
	if name == "" {
		return nil, nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, nil, fmt.Errorf("guest: the runner's user: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, nil, fmt.Errorf("guest: the runner's user %s has uid %q and gid %q", name, u.Uid, u.Gid)
	}
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
		"HOME=" + u.HomeDir, "USER=" + u.Username, "LOGNAME=" + u.Username, "SHELL=/bin/bash",
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, env, nil
}

func redeem(ctx context.Context, hc *http.Client, seed Seed) (executor.Grant, error) {
	body, _ := json.Marshal(executor.RedeemRequest{InstanceID: seed.InstanceID, Nonce: seed.Nonce})
	var last error
	// The bridge may need a moment after boot; the nonce itself redeems once.
	for attempt := range 30 {
		if attempt > 0 {
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
				t.Stop()
				return executor.Grant{}, ctx.Err()
			case <-t.C:
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(seed.Endpoint, "/")+executor.RedeemPath, bytes.NewReader(body))
		if err != nil {
			return executor.Grant{}, fmt.Errorf("guest: redeem: %w", err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			last = err
			continue
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		g, retry, err := redeemAnswer(resp.StatusCode, resp.Status, data)
		if retry {
			last = err
			continue
		}
		return g, err
	}
	return executor.Grant{}, fmt.Errorf("guest: nonce endpoint %s unreachable: %w", seed.Endpoint, last)
}

// redeemAnswer decides what the nonce endpoint's answer means: the grant, a final refusal
// (any 4xx: a refused nonce is never retried, and an answer that is no grant), or, with retry
// set, a server error worth another attempt.
func redeemAnswer(code int, status string, body []byte) (g executor.Grant, retry bool, err error) {
	if code != http.StatusOK {
		if code < 500 {
			return executor.Grant{}, false, fmt.Errorf("guest: redeem refused (%s): %s", status, strings.TrimSpace(string(body)))
		}
		return executor.Grant{}, true, fmt.Errorf("%s", status)
	}
	if err := json.Unmarshal(body, &g); err != nil {
		return executor.Grant{}, false, fmt.Errorf("guest: redeem answer: %w", err)
	}
	return g, false, nil
}

// download fetches the runner binary and keeps it only if its SHA-256 is the granted one.
func download(ctx context.Context, hc *http.Client, from, to, sha string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, from, nil)
	if err != nil {
		return fmt.Errorf("guest: runner download: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("guest: runner download: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("guest: runner download: %s", resp.Status)
	}
	// Executable by the runner's user; the SHA-256 below decides whether it is kept.
	f, err := os.OpenFile(to+".part", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return fmt.Errorf("guest: runner download: %w", err)
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("guest: runner download: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(got, sha) {
		os.Remove(to + ".part")
		return fmt.Errorf("guest: runner download has SHA-256 %s, the grant pins %s", got, sha)
	}
	return os.Rename(to+".part", to)
}
