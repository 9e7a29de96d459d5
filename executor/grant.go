package executor

import (
	"fmt"
	"strconv"
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
// returns. NewGrant encodes a Config, Grant.Config decodes it.
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
// renewal interval renews every DefaultRenew.
func (g Grant) Config() (Config, error) {
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
