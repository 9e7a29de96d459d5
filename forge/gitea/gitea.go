package gitea

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"

	"github.com/dynrunner/dynrunner/forge"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// Credentials are the resident runner's identity at the forge. They never leave the controller.
type Credentials struct {
	UUID  string `json:"uuid"`
	Token string `json:"token"`
	// URL is the forge the credentials belong to; a changed GITEA_URL refuses stale ones.
	URL string `json:"url"`
}

// Config configures the Gitea client.
type Config struct {
	URL string
	// UUIDFile and TokenFile hold existing credentials; or
	UUIDFile, TokenFile string
	// RegistrationTokenFile holds a registration token used on first start; the resulting
	// credentials are kept in StateDir (mode 0600) and reused.
	RegistrationTokenFile string
	StateDir              string
	// Name is the runner name shown in Gitea; Labels are declared on every start.
	Name    string
	Labels  []string
	Version string
	HTTP    *http.Client
}

const credentialsFile = "gitea-runner.json"

// Client is the forge.Forge of a Gitea server.
type Client struct {
	client runnerv1connect.RunnerServiceClient
	creds  Credentials
}

var _ forge.Forge = (*Client)(nil)

func headerInterceptor(uuid, token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if uuid != "" {
				req.Header().Set("x-runner-uuid", uuid)
				req.Header().Set("x-runner-token", token)
			}
			return next(ctx, req)
		}
	}
}

func baseURL(u string) string { return strings.TrimRight(u, "/") + "/api/actions" }

// Connect loads or obtains the resident runner's credentials and declares its labels.
func Connect(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 30 * time.Second}
	}
	creds, err := loadCredentials(ctx, cfg)
	if err != nil {
		return nil, err
	}
	g := &Client{
		client: runnerv1connect.NewRunnerServiceClient(cfg.HTTP, baseURL(cfg.URL), connect.WithInterceptors(headerInterceptor(creds.UUID, creds.Token))),
		creds:  creds,
	}
	if _, err := g.client.Declare(ctx, connect.NewRequest(&runnerv1.DeclareRequest{Version: cfg.Version, Labels: cfg.Labels})); err != nil {
		return nil, fmt.Errorf("gitea: declare labels %v to %s: %w", cfg.Labels, cfg.URL, err)
	}
	return g, nil
}

func loadCredentials(ctx context.Context, cfg Config) (Credentials, error) {
	if cfg.UUIDFile != "" || cfg.TokenFile != "" {
		if cfg.UUIDFile == "" || cfg.TokenFile == "" {
			return Credentials{}, errors.New("gitea: GITEA_RUNNER_UUID_FILE and GITEA_RUNNER_TOKEN_FILE must be set together")
		}
		uuid, err := secretfile.Read(cfg.UUIDFile)
		if err != nil {
			return Credentials{}, fmt.Errorf("gitea: GITEA_RUNNER_UUID_FILE: %w", err)
		}
		token, err := secretfile.Read(cfg.TokenFile)
		if err != nil {
			return Credentials{}, fmt.Errorf("gitea: GITEA_RUNNER_TOKEN_FILE: %w", err)
		}
		return Credentials{UUID: string(uuid), Token: string(token), URL: cfg.URL}, nil
	}
	path := filepath.Join(cfg.StateDir, credentialsFile)
	if data, err := secretfile.Read(path); err == nil {
		var c Credentials
		if err := json.Unmarshal(data, &c); err != nil || c.UUID == "" || c.Token == "" {
			return Credentials{}, fmt.Errorf("gitea: %s is not valid runner credentials; remove it to register again", path)
		}
		if c.URL != cfg.URL {
			return Credentials{}, fmt.Errorf("gitea: %s belongs to %s, not GITEA_URL=%s; remove it to register again", path, c.URL, cfg.URL)
		}
		return c, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return Credentials{}, fmt.Errorf("gitea: stored runner credentials: %w", err)
	}
	if cfg.RegistrationTokenFile == "" {
		return Credentials{}, errors.New("gitea: no Gitea runner credentials: set GITEA_RUNNER_UUID_FILE and GITEA_RUNNER_TOKEN_FILE, or GITEA_RUNNER_REGISTRATION_TOKEN_FILE to register on first start")
	}
	regToken, err := secretfile.Read(cfg.RegistrationTokenFile)
	if err != nil {
		return Credentials{}, fmt.Errorf("gitea: GITEA_RUNNER_REGISTRATION_TOKEN_FILE: %w", err)
	}
	c, err := Register(ctx, cfg.HTTP, cfg.URL, string(regToken), cfg.Name, cfg.Labels, cfg.Version)
	if err != nil {
		return Credentials{}, err
	}
	data, _ := json.Marshal(c)
	if err := secretfile.WriteNew(path, data); err != nil {
		return Credentials{}, fmt.Errorf("gitea: keep runner credentials: %w", err)
	}
	return c, nil
}

// Register registers a new (non-ephemeral) runner with a registration token.
func Register(ctx context.Context, hc *http.Client, url, regToken, name string, labels []string, version string) (Credentials, error) {
	client := runnerv1connect.NewRunnerServiceClient(hc, baseURL(url))
	resp, err := client.Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{
		Name: name, Token: regToken, Version: version, Labels: labels,
	}))
	if err != nil {
		return Credentials{}, fmt.Errorf("gitea: register runner %q at %s: %w", name, url, err)
	}
	r := resp.Msg.GetRunner()
	if r.GetUuid() == "" || r.GetToken() == "" {
		return Credentials{}, fmt.Errorf("gitea: register runner at %s: response without credentials", url)
	}
	return Credentials{UUID: r.Uuid, Token: r.Token, URL: url}, nil
}

// FetchTask implements forge.Forge.
func (g *Client) FetchTask(ctx context.Context, tasksVersion int64) (*runnerv1.FetchTaskResponse, error) {
	resp, err := g.client.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{TasksVersion: tasksVersion}))
	if err != nil {
		return nil, fmt.Errorf("gitea: fetch task: %w", err)
	}
	return resp.Msg, nil
}

// UpdateTask implements forge.Forge.
func (g *Client) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	resp, err := g.client.UpdateTask(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, fmt.Errorf("gitea: update task %d: %w", req.GetState().GetId(), err)
	}
	return resp.Msg, nil
}

// UpdateLog implements forge.Forge.
func (g *Client) UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	resp, err := g.client.UpdateLog(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, fmt.Errorf("gitea: update log of task %d: %w", req.GetTaskId(), err)
	}
	return resp.Msg, nil
}
