package github

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v4"

	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// The REST API calls dynrunner makes itself, beside the scaleset library's: a workflow run's
// status and rerun-failed-jobs (Reruns). They authenticate as the library does: with the token
// of GITHUB_TOKEN_FILE, or with an installation token of the GitHub App, which dynrunner makes
// from the App's key and keeps until half its lifetime has passed. Neither ever appears in an
// error or a log line.

// WorkflowRun is what dynrunner reads of a GitHub workflow run.
type WorkflowRun struct {
	ID int64 `json:"id"`
	// Attempt is GitHub's run_attempt: 1, then one more for each rerun, whoever asked for it.
	Attempt int `json:"run_attempt"`
	// Status is queued, in_progress, completed (or waiting, requested, pending).
	Status string `json:"status"`
	// Conclusion is set once the run completed: success, failure, cancelled, ...
	Conclusion string `json:"conclusion"`
}

// Completed reports whether the run's current attempt has ended.
func (r WorkflowRun) Completed() bool { return r.Status == "completed" }

// Failed reports whether the run completed with a failure: some job of it failed.
func (r WorkflowRun) Failed() bool { return r.Completed() && r.Conclusion == "failure" }

// APIError is GitHub refusing a REST call: its status and message, never the request's
// credentials.
type APIError struct {
	Op      string
	Status  int
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("github: %s: %d %s: %s", e.Op, e.Status, http.StatusText(e.Status), e.Message)
}

// notFound reports whether err is GitHub answering 404: the run does not exist, or the
// credentials cannot see it.
func notFound(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// ownerRE and repoRE are GitHub's rules for account and repository names.
var (
	ownerRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$`)
	repoRE  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)
)

// ErrBadRepo: a repository name that is not GitHub's owner/name.
var ErrBadRepo = errors.New("not a GitHub repository owner/name")

// SplitRepo checks that repo is a GitHub repository's owner/name, as a JobStarted message
// names it, and returns its two parts; ErrBadRepo otherwise. Nothing else is put into a path.
func SplitRepo(repo string) (owner, name string, err error) {
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || !ownerRE.MatchString(owner) || !repoRE.MatchString(name) || name == "." || name == ".." {
		return "", "", fmt.Errorf("github: repository %q: %w", repo, ErrBadRepo)
	}
	return owner, name, nil
}

// apiBase is the REST API's base URL for the configuration URL, as the scaleset library
// computes it: https://api.github.com (api.<host> for GHE.com) for hosted GitHub, <host>/api/v3
// for GitHub Enterprise Server.
func apiBase(configURL string) (*url.URL, error) {
	u, err := url.Parse(strings.Trim(configURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("github: GITHUB_CONFIG_URL: %w", err)
	}
	base := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: "/api/v3"}
	host := strings.ToLower(u.Hostname())
	if host == "github.com" || host == "www.github.com" || host == "github.localhost" || strings.HasSuffix(host, ".ghe.com") {
		base.Host, base.Path = "api."+strings.TrimPrefix(u.Host, "www."), ""
	}
	return base, nil
}

// maxAnswer bounds what is read of a REST answer.
const maxAnswer = 1 << 20

// restToken is the token of the REST calls: the token file's, read at each call (a rotated
// file is picked up at once), or an installation token of the App, made again when half of its
// lifetime has passed or GitHub refused it.
type restToken struct {
	mu      sync.Mutex
	token   string
	renewAt time.Time
}

// restTokenValue returns the token to call the REST API with.
func (c *Clients) restTokenValue(ctx context.Context) (string, error) {
	a := c.cfg.Auth
	if a.TokenFile != "" {
		b, err := secretfile.Read(a.TokenFile)
		if err != nil {
			return "", fmt.Errorf("github: read GITHUB_TOKEN_FILE: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("github: GITHUB_TOKEN_FILE %s is empty", a.TokenFile)
		}
		return tok, nil
	}
	c.rest.mu.Lock()
	defer c.rest.mu.Unlock()
	now := c.cfg.Now()
	if c.rest.token != "" && now.Before(c.rest.renewAt) {
		return c.rest.token, nil
	}
	tok, exp, err := c.installationToken(ctx)
	if err != nil {
		c.cfg.Metrics.Refreshes.WithLabelValues("failed").Inc()
		c.cfg.Metrics.CredentialOK.Set(0)
		return "", err
	}
	c.rest.token, c.rest.renewAt = tok, now.Add(exp.Sub(now)/2)
	return tok, nil
}

// restRefused drops the installation token GitHub refused and tells the clients.
func (c *Clients) restRefused() {
	c.rest.mu.Lock()
	c.rest.token = ""
	c.rest.mu.Unlock()
	c.Refused()
}

// installationToken exchanges a JWT signed with the App's key for an installation token.
func (c *Clients) installationToken(ctx context.Context) (string, time.Time, error) {
	a := c.cfg.Auth
	pem, err := secretfile.Read(a.PrivateKeyFile)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("github: read GITHUB_APP_PRIVATE_KEY_FILE: %w", err)
	}
	key, err := jwt.ParseRSAPrivateKeyFromPEM(pem)
	if err != nil {
		return "", time.Time{}, errors.New("github: GITHUB_APP_PRIVATE_KEY_FILE holds no RSA private key in PEM")
	}
	issued := c.cfg.Now().Add(-time.Minute) // GitHub's clock may be behind
	signed, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.RegisteredClaims{
		Issuer: a.AppID, IssuedAt: jwt.NewNumericDate(issued), ExpiresAt: jwt.NewNumericDate(issued.Add(9 * time.Minute)),
	}).SignedString(key)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("github: sign the App's JWT: %w", err)
	}
	var out struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	op := "make an installation token"
	path := "/app/installations/" + strconv.FormatInt(a.InstallationID, 10) + "/access_tokens"
	if err := c.restCall(ctx, op, http.MethodPost, path, "Bearer "+signed, http.StatusCreated, &out); err != nil {
		return "", time.Time{}, err
	}
	if out.Token == "" || !out.ExpiresAt.After(c.cfg.Now()) {
		return "", time.Time{}, fmt.Errorf("github: %s: the answer holds no token that has not expired", op)
	}
	return out.Token, out.ExpiresAt, nil
}

// GetWorkflowRun reads workflow run runID of repository repo (owner/name).
func (c *Clients) GetWorkflowRun(ctx context.Context, repo string, runID int64) (WorkflowRun, error) {
	var run WorkflowRun
	err := c.repoCall(ctx, "read workflow run "+strconv.FormatInt(runID, 10)+" of "+repo, http.MethodGet, repo,
		"/actions/runs/"+strconv.FormatInt(runID, 10), http.StatusOK, &run)
	if err == nil && run.ID != runID {
		err = fmt.Errorf("github: read workflow run %d of %s: the answer is run %d", runID, repo, run.ID)
	}
	return run, err
}

// RerunFailedJobs asks GitHub to run the failed jobs of workflow run runID of repo again, and
// the jobs that depend on them. GitHub refuses it (403) while the run has not completed.
func (c *Clients) RerunFailedJobs(ctx context.Context, repo string, runID int64) error {
	return c.repoCall(ctx, "rerun the failed jobs of workflow run "+strconv.FormatInt(runID, 10)+" of "+repo, http.MethodPost, repo,
		"/actions/runs/"+strconv.FormatInt(runID, 10)+"/rerun-failed-jobs", http.StatusCreated, nil)
}

// repoCall calls path under repository repo's actions with the REST token.
func (c *Clients) repoCall(ctx context.Context, op, method, repo, path string, want int, out any) error {
	owner, name, err := SplitRepo(repo)
	if err != nil {
		return err
	}
	tok, err := c.restTokenValue(ctx)
	if err != nil {
		return err
	}
	err = c.restCall(ctx, op, method, "/repos/"+url.PathEscape(owner)+"/"+url.PathEscape(name)+path, "Bearer "+tok, want, out)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized {
		c.restRefused()
	}
	return err
}

// restCall makes one REST call and decodes its answer into out (when not nil). The error names
// op and GitHub's status and message, never auth.
func (c *Clients) restCall(ctx context.Context, op, method, path, auth string, want int, out any) error {
	base, err := apiBase(c.cfg.URL)
	if err != nil {
		return err
	}
	u := *base
	u.Path += path
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return fmt.Errorf("github: %s: %w", op, err)
	}
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	req.Header.Set("User-Agent", "dynrunner/"+c.cfg.Version)
	req.Header.Set("Authorization", auth)
	resp, err := c.HTTP().Do(req)
	if err != nil {
		return fmt.Errorf("github: %s: %w", op, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("github: %s: read the answer: %w", op, err)
	}
	if resp.StatusCode != want {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(body, &e)
		if len(e.Message) > 200 {
			e.Message = e.Message[:200] + "…"
		}
		return &APIError{Op: op, Status: resp.StatusCode, Message: e.Message}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("github: %s: decode the answer: %w", op, err)
	}
	return nil
}
