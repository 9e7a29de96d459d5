package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// The executor contract of a GitHub slot's environment (docs/configuration.md, "Executor
// variables"): DYNRUNNER_FORGE=github, the slot, the pinned GitHub Actions runner, and the
// secrets and work directories the backend adds. Nothing of the facade: the runner talks to
// GitHub itself, and its JIT configuration (JITConfigFile in the secrets directory) is the
// only credential the environment gets.
const (
	EnvForge              = "DYNRUNNER_FORGE"
	EnvGitHubRunnerBin    = "GITHUB_RUNNER_BIN"
	EnvGitHubRunnerSHA256 = "GITHUB_RUNNER_SHA256"
)

// JITConfigFile is the name of a GitHub slot's JIT configuration in its secrets directory.
const JITConfigFile = "github-jitconfig"

// envRunnerJITConfig is the variable the GitHub Actions runner reads its --jitconfig input
// from (ACTIONS_RUNNER_INPUT_<NAME>): unlike a command line, which every user of the machine
// may read in /proc, a process's environment is readable only by its own user and root.
const envRunnerJITConfig = "ACTIONS_RUNNER_INPUT_JITCONFIG"

// GitHubConfig is what a GitHub slot's environment is given.
type GitHubConfig struct {
	// Task and Epoch name the slot.
	Task  assignment.TaskID
	Epoch assignment.Epoch
	// SecretsDir holds the JIT configuration (JITConfigFile); WorkDir is the runner's and the
	// job's work directory.
	SecretsDir string
	WorkDir    string
	// RunnerBin is the pinned GitHub Actions runner's run.sh (or a stand-in in tests), and
	// RunnerSHA256 its SHA-256.
	RunnerBin    string
	RunnerSHA256 string
	LogFormat    string
}

// Environ encodes c as environment variables; the worker adds the slot's (Task, Epoch), the
// backend its directories, each only when set, as for a Gitea environment.
func (c GitHubConfig) Environ() map[string]string {
	env := map[string]string{
		EnvForge:              string(assignment.ForgeGitHub),
		EnvGitHubRunnerBin:    c.RunnerBin,
		EnvGitHubRunnerSHA256: c.RunnerSHA256,
		EnvLogFormat:          c.LogFormat,
	}
	if c.Task != 0 {
		env[EnvTaskID] = c.Task.String()
	}
	if c.Epoch != 0 {
		env[EnvEpoch] = c.Epoch.String()
	}
	setNonEmpty(env, EnvSecretsDir, c.SecretsDir)
	setNonEmpty(env, EnvWorkDir, c.WorkDir)
	return env
}

// IsGitHub reports whether the environment getenv reads is a GitHub slot's.
func IsGitHub(getenv func(string) string) bool {
	return getenv(EnvForge) == string(assignment.ForgeGitHub)
}

// ParseGitHubEnv reads a GitHub slot's configuration; every refused variable is an
// *EnvError, all reported together.
func ParseGitHubEnv(getenv func(string) string) (GitHubConfig, error) {
	var errs []error
	refuse := func(key string, err error) { errs = append(errs, &EnvError{Key: key, Err: err}) }
	need := func(key string) string {
		v := getenv(key)
		if v == "" {
			refuse(key, ErrNotSet)
		}
		return v
	}
	if f := getenv(EnvForge); f != string(assignment.ForgeGitHub) {
		refuse(EnvForge, fmt.Errorf("%q: want github", f))
	}
	c := GitHubConfig{
		SecretsDir:   need(EnvSecretsDir),
		WorkDir:      need(EnvWorkDir),
		RunnerBin:    need(EnvGitHubRunnerBin),
		RunnerSHA256: need(EnvGitHubRunnerSHA256),
		LogFormat:    getenv(EnvLogFormat),
	}
	if v := need(EnvTaskID); v != "" {
		t, err := assignment.ParseTaskID(v)
		if err == nil && !t.Slot() {
			err = fmt.Errorf("%s is no GitHub slot's id", v)
		}
		if err != nil {
			refuse(EnvTaskID, err)
		}
		c.Task = t
	}
	if v := need(EnvEpoch); v != "" {
		e, err := assignment.ParseEpoch(v)
		if err != nil {
			refuse(EnvEpoch, err)
		}
		c.Epoch = e
	}
	if c.LogFormat == "" {
		c.LogFormat = DefaultLogFormat
	}
	if len(errs) > 0 {
		return GitHubConfig{}, fmt.Errorf("executor configuration: %w", errors.Join(errs...))
	}
	return c, nil
}

// GitHubRunConfig configures one run of a GitHub slot's environment.
type GitHubRunConfig struct {
	GitHubConfig
	// Env is the environment the runner, and through it the job, starts from (os.Environ);
	// the executor's own settings are removed from it.
	Env []string
	// Credential, when set, runs the runner as that user.
	Credential *syscall.Credential
	// Output receives the runner's output.
	Output io.Writer
	Log    zerolog.Logger
}

// RunGitHub runs a GitHub slot's environment: it checks the pinned runner, takes the JIT
// configuration out of the secrets directory (the file is removed once read, so the job cannot
// read it there) and runs the runner once with it. GitHub gives the runner a job, the runner
// reports to GitHub itself, and exits after it. It returns nil when the runner exited 0.
func RunGitHub(ctx context.Context, cfg GitHubRunConfig) error {
	if err := VerifyRunner(ctx, cfg.RunnerBin, cfg.RunnerSHA256, ""); err != nil {
		return fmt.Errorf("GitHub Actions runner: %w", err)
	}
	path := filepath.Join(cfg.SecretsDir, JITConfigFile)
	jit, err := secretfile.Read(path)
	if err != nil {
		return fmt.Errorf("JIT configuration: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("JIT configuration: remove it once read: %w", err)
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	if cfg.Credential != nil {
		if err := os.Chown(cfg.WorkDir, int(cfg.Credential.Uid), int(cfg.Credential.Gid)); err != nil {
			return fmt.Errorf("work directory: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, cfg.RunnerBin)
	cmd.Dir = cfg.WorkDir
	cmd.Env = append(githubOwnEnvRemoved(cfg.Env), envRunnerJITConfig+"="+strings.TrimSpace(string(jit)))
	cmd.Stdout, cmd.Stderr = cfg.Output, cfg.Output
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	if cfg.Credential != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cfg.Credential}
	}
	cfg.Log.Info().Str("runner", cfg.RunnerBin).Msg("starting the GitHub Actions runner")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the GitHub Actions runner: %w", err)
	}
	cfg.Log.Info().Msg("the GitHub Actions runner finished its job")
	return nil
}

// githubOwnEnvRemoved is ownEnvRemoved, and the GitHub runner's pin.
func githubOwnEnvRemoved(env []string) []string {
	out := ownEnvRemoved(env)
	for _, k := range []string{EnvGitHubRunnerBin, EnvGitHubRunnerSHA256, envRunnerJITConfig} {
		out = withoutKey(out, k)
	}
	return out
}
