package executor

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// The nonce endpoint's protocol: a microVM guest POSTs a RedeemRequest to RedeemPath and
// receives its Grant; it downloads the pinned runner from the grant's RunnerPath.
const (
	RedeemPath = "/v1/redeem"
	RunnerPath = "/v1/runner"
)

// RedeemRequest is the body of POST RedeemPath.
type RedeemRequest struct {
	InstanceID string `json:"instance_id"`
	Nonce      string `json:"nonce"`
}

// Grant is the executor contract as a microVM guest receives it: what a redeemed nonce
// returns. NewGrant encodes a Gitea assignment's Config, Grant.Config decodes it;
// NewGitHubGrant encodes a GitHub slot's GitHubConfig with its JIT configuration (a grant
// with GitHub set), Grant.GitHubConfig decodes it.
type Grant struct {
	TaskID         int64    `json:"task_id"`
	Epoch          uint64   `json:"epoch"`
	Token          string   `json:"token"`
	FacadeURL      string   `json:"facade_url"`
	FacadeSpiffeID string   `json:"facade_spiffe_id"`
	FacadeCAPEM    string   `json:"facade_ca_pem"`
	RunnerPath     string   `json:"runner_path"`
	RunnerSHA256   string   `json:"runner_sha256"`
	RunnerVersion  string   `json:"runner_version"`
	Labels         []string `json:"labels"`
	RenewSecs      int      `json:"renew_secs"`
	// ForgeURL is the forge's own URL, the server URL the job sees (empty when unknown).
	ForgeURL string `json:"forge_url,omitempty"`
	// GitHub, when set, makes this a GitHub slot's grant: the guest runs GitHub's runner with
	// the JIT configuration, and the Gitea fields above are empty.
	GitHub *GitHubGrant `json:"github,omitempty"`
}

// GitHubGrant is what a GitHub slot's guest is given besides its slot: the JIT configuration,
// its only credential, and the pinned GitHub Actions runner the guest image holds (it is not
// downloaded: GitHub's runner is a directory, not one binary).
type GitHubGrant struct {
	JITConfig    string `json:"jit_config"`
	RunnerBin    string `json:"runner_bin"`
	RunnerSHA256 string `json:"runner_sha256"`
}

// IsGitHub reports whether g is a GitHub slot's grant.
func (g Grant) IsGitHub() bool { return g.GitHub != nil }

// NewGitHubGrant encodes a GitHub slot's configuration for a guest: its slot and epoch, the
// runner's path in the guest and its SHA-256 (c.RunnerBin, c.RunnerSHA256), and jit, the
// slot's JIT configuration. c's directories and log format are the guest's own.
func NewGitHubGrant(c GitHubConfig, jit string) Grant {
	return Grant{TaskID: int64(c.Task), Epoch: uint64(c.Epoch),
		GitHub: &GitHubGrant{JITConfig: jit, RunnerBin: c.RunnerBin, RunnerSHA256: c.RunnerSHA256}}
}

// GitHubConfig decodes a GitHub slot's grant and validates it: the slot's id and epoch, an
// absolute runner path, a SHA-256 and a JIT configuration. The guest adds its directories and
// log format. It refuses a Gitea assignment's grant.
func (g Grant) GitHubConfig() (GitHubConfig, string, error) {
	if g.GitHub == nil {
		return GitHubConfig{}, "", errors.New("grant: a Gitea assignment's grant, not a GitHub slot's")
	}
	task, err := assignment.ParseTaskID(strconv.FormatInt(g.TaskID, 10))
	if err == nil && !task.Slot() {
		err = fmt.Errorf("task %d is no GitHub slot's id", g.TaskID)
	}
	if err != nil {
		return GitHubConfig{}, "", fmt.Errorf("grant: %w", err)
	}
	epoch, err := assignment.ParseEpoch(strconv.FormatUint(g.Epoch, 10))
	if err != nil {
		return GitHubConfig{}, "", fmt.Errorf("grant: %w", err)
	}
	gh := g.GitHub
	switch {
	case !filepath.IsAbs(gh.RunnerBin):
		return GitHubConfig{}, "", fmt.Errorf("grant: the GitHub Actions runner's path %q is not absolute", gh.RunnerBin)
	case len(gh.RunnerSHA256) != 64 || strings.Trim(strings.ToLower(gh.RunnerSHA256), "0123456789abcdef") != "":
		return GitHubConfig{}, "", errors.New("grant: the GitHub Actions runner's SHA-256 is not 64 hex digits")
	case strings.TrimSpace(gh.JITConfig) == "":
		return GitHubConfig{}, "", errors.New("grant: a GitHub slot's grant without its JIT configuration")
	}
	return GitHubConfig{Task: task, Epoch: epoch, RunnerBin: gh.RunnerBin, RunnerSHA256: gh.RunnerSHA256}, gh.JITConfig, nil
}

// NewGrant encodes c for a guest with its single-use token and the facade's CA bundle (PEM).
// The guest downloads the runner from the endpoint's RunnerPath, not from c.RunnerBin, and
// chooses its own work directory; c's secrets directory, Workload API socket and log format
// are not the guest's.
func NewGrant(c Config, token string, facadeCAPEM []byte) Grant {
	return Grant{
		TaskID: int64(c.Task), Epoch: uint64(c.Epoch), Token: token,
		FacadeURL: c.FacadeURL, FacadeSpiffeID: c.FacadeID.String(), FacadeCAPEM: string(facadeCAPEM),
		RunnerPath: RunnerPath, RunnerSHA256: c.RunnerSHA256, RunnerVersion: c.RunnerVersion,
		Labels: c.Labels, RenewSecs: int(c.Renew.Seconds()), ForgeURL: c.ForgeURL.String(),
	}
}

// Config decodes the grant's part of the executor contract and validates it. The guest adds
// what is its own: the runner binary it downloaded and its work directory. A grant without a
// renewal interval renews every DefaultRenew. It refuses a GitHub slot's grant.
func (g Grant) Config() (Config, error) {
	if g.GitHub != nil {
		return Config{}, errors.New("grant: a GitHub slot's grant, not a Gitea assignment's")
	}
	task, err := assignment.ParseTaskID(strconv.FormatInt(g.TaskID, 10))
	if err != nil {
		return Config{}, err
	}
	epoch, err := assignment.ParseEpoch(strconv.FormatUint(g.Epoch, 10))
	if err != nil {
		return Config{}, err
	}
	if _, err := ParseFacadeURLs(g.FacadeURL); err != nil {
		return Config{}, fmt.Errorf("grant: %w", err)
	}
	facadeID, err := spiffeid.FromString(g.FacadeSpiffeID)
	if err != nil {
		return Config{}, fmt.Errorf("facade SPIFFE ID: %w", err)
	}
	var forge assignment.ForgeURL
	if g.ForgeURL != "" {
		if forge, err = assignment.ParseForgeURL(g.ForgeURL); err != nil {
			return Config{}, fmt.Errorf("grant: %w", err)
		}
	}
	renew := time.Duration(g.RenewSecs) * time.Second
	if renew <= 0 {
		renew = DefaultRenew
	}
	return Config{
		FacadeURL: g.FacadeURL, FacadeID: facadeID, Task: task, Epoch: epoch, ForgeURL: forge,
		Labels: g.Labels, Renew: renew, RunnerSHA256: g.RunnerSHA256, RunnerVersion: g.RunnerVersion,
	}, nil
}
