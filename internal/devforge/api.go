package devforge

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// APIError is returned (wrapped) when Gitea answers with a non-2xx status.
type APIError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status, http.StatusText(e.Status), strings.TrimSpace(e.Body))
}

// do calls the Gitea API as the admin user. in (if not nil) is sent as JSON; out (if not nil)
// receives the JSON answer, or the raw text when out is a *string.
func (f *Forge) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("devforge: %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, f.url+path, body)
	if err != nil {
		return fmt.Errorf("devforge: %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "token "+f.state.AdminToken)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("devforge: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("devforge: %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("devforge: %w", &APIError{Method: method, Path: path, Status: resp.StatusCode, Body: string(b)})
	}
	switch out := out.(type) {
	case nil:
	case *string:
		*out = string(b)
	default:
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("devforge: %s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// Repo is a repository on the forge.
type Repo struct {
	Owner         string
	Name          string
	DefaultBranch string
	CloneURL      string
}

// String is "owner/name".
func (r Repo) String() string { return r.Owner + "/" + r.Name }

func (r Repo) apiPath() string {
	return "/api/v1/repos/" + url.PathEscape(r.Owner) + "/" + url.PathEscape(r.Name)
}

// CreateRepo creates a repository owned by [AdminUser] with an initial commit on its default
// branch (main).
func (f *Forge) CreateRepo(ctx context.Context, name string) (Repo, error) {
	return f.createRepo(ctx, name, false)
}

// CreatePrivateRepo is [Forge.CreateRepo] for a private repository: only its owner, the site
// administrator and the jobs of its own workflows can read it.
func (f *Forge) CreatePrivateRepo(ctx context.Context, name string) (Repo, error) {
	return f.createRepo(ctx, name, true)
}

// CreateOrgRepo creates organisation org (with [AdminUser] as its owner) unless it exists, and
// in it a repository as [Forge.CreateRepo] does: for tests that need jobs of several owners.
func (f *Forge) CreateOrgRepo(ctx context.Context, org, name string) (Repo, error) {
	err := f.do(ctx, http.MethodPost, "/api/v1/orgs", map[string]any{"username": org, "visibility": "public"}, nil)
	var apiErr *APIError
	if err != nil && (!errors.As(err, &apiErr) || apiErr.Status != http.StatusUnprocessableEntity) {
		return Repo{}, err
	}
	return f.postRepo(ctx, "/api/v1/orgs/"+url.PathEscape(org)+"/repos", name, false)
}

func (f *Forge) createRepo(ctx context.Context, name string, private bool) (Repo, error) {
	return f.postRepo(ctx, "/api/v1/user/repos", name, private)
}

func (f *Forge) postRepo(ctx context.Context, path, name string, private bool) (Repo, error) {
	var out struct {
		Name          string `json:"name"`
		DefaultBranch string `json:"default_branch"`
		CloneURL      string `json:"clone_url"`
		Owner         struct {
			Login string `json:"login"`
		} `json:"owner"`
	}
	in := map[string]any{"name": name, "auto_init": true, "default_branch": "main", "private": private}
	if err := f.do(ctx, http.MethodPost, path, in, &out); err != nil {
		return Repo{}, err
	}
	return Repo{Owner: out.Owner.Login, Name: out.Name, DefaultBranch: out.DefaultBranch, CloneURL: out.CloneURL}, nil
}

// BranchHead returns the subject of the last commit on branch of repo.
func (f *Forge) BranchHead(ctx context.Context, repo Repo, branch string) (string, error) {
	var out struct {
		Commit struct {
			Message string `json:"message"`
		} `json:"commit"`
	}
	if err := f.do(ctx, http.MethodGet, repo.apiPath()+"/branches/"+url.PathEscape(branch), nil, &out); err != nil {
		return "", err
	}
	subject, _, _ := strings.Cut(out.Commit.Message, "\n")
	return subject, nil
}

// SetSecret creates or updates an Actions secret of repo.
func (f *Forge) SetSecret(ctx context.Context, repo Repo, name, value string) error {
	return f.do(ctx, http.MethodPut, repo.apiPath()+"/actions/secrets/"+url.PathEscape(name),
		map[string]string{"data": value}, nil)
}

// PushFile creates or updates one file on repo's default branch with a new commit and returns
// the commit's SHA. Like a git push, the commit triggers `on: push` workflows.
func (f *Forge) PushFile(ctx context.Context, repo Repo, path, content string) (string, error) {
	return f.PushFiles(ctx, repo, map[string]string{path: content})
}

// PushFiles creates or updates files (content by path) on repo's default branch in one commit
// and returns the commit's SHA, e.g. to publish an action (action.yml and its script) that
// workflows then use. Like a git push, the commit triggers `on: push` workflows.
func (f *Forge) PushFiles(ctx context.Context, repo Repo, files map[string]string) (string, error) {
	if len(files) == 0 {
		return "", fmt.Errorf("devforge: push to %s: no files", repo)
	}
	paths := slices.Sorted(maps.Keys(files))
	ops := make([]map[string]string, 0, len(paths))
	for _, p := range paths {
		ops = append(ops, map[string]string{
			"operation": "upload", // create or update
			"path":      p,
			"content":   base64.StdEncoding.EncodeToString([]byte(files[p])),
		})
	}
	in := map[string]any{
		"message": "devforge: update " + strings.Join(paths, ", "),
		"files":   ops,
	}
	var out struct {
		Commit struct {
			SHA string `json:"sha"`
		} `json:"commit"`
	}
	if err := f.do(ctx, http.MethodPost, repo.apiPath()+"/contents", in, &out); err != nil {
		return "", err
	}
	if out.Commit.SHA == "" {
		return "", fmt.Errorf("devforge: push %s to %s: no commit in the answer", strings.Join(paths, ", "), repo)
	}
	return out.Commit.SHA, nil
}

// PushWorkflow is [PushFile] for a workflow file (e.g. ".gitea/workflows/ci.yml"). Pass the
// returned commit SHA to [Forge.WaitRun] to wait for exactly the run it triggers.
func (f *Forge) PushWorkflow(ctx context.Context, repo Repo, path, content string) (string, error) {
	if !strings.HasPrefix(path, ".gitea/workflows/") && !strings.HasPrefix(path, ".github/workflows/") {
		return "", fmt.Errorf("devforge: workflow path %q is not under .gitea/workflows/ or .github/workflows/", path)
	}
	return f.PushFile(ctx, repo, path, content)
}

// RunnerRegistrationToken returns a runner registration token. scope "" is instance-wide,
// "owner/repo" a repository, "owner" a user or organisation. Gitea returns the current token
// of the scope (creating one if needed); a token registers any number of runners.
func (f *Forge) RunnerRegistrationToken(ctx context.Context, scope string) (string, error) {
	var path string
	switch owner, repo, isRepo := strings.Cut(scope, "/"); {
	case scope == "":
		path = "/api/v1/admin/actions/runners/registration-token"
	case isRepo:
		if owner == "" || repo == "" || strings.Contains(repo, "/") {
			return "", fmt.Errorf("devforge: runner token scope %q: want \"\", \"owner\" or \"owner/repo\"", scope)
		}
		path = Repo{Owner: owner, Name: repo}.apiPath() + "/actions/runners/registration-token"
	case owner == AdminUser:
		path = "/api/v1/user/actions/runners/registration-token"
	default:
		path = "/api/v1/orgs/" + url.PathEscape(owner) + "/actions/runners/registration-token"
	}
	var out struct {
		Token string `json:"token"`
	}
	if err := f.do(ctx, http.MethodPost, path, nil, &out); err != nil {
		return "", err
	}
	if out.Token == "" {
		return "", errors.New("devforge: gitea returned an empty registration token")
	}
	return out.Token, nil
}

// Runner is a runner registered on the forge.
type Runner struct {
	ID        int64
	Name      string
	Status    string // "online" or "offline"
	Busy      bool
	Disabled  bool
	Ephemeral bool
	Labels    []string
}

// Runners lists all runners of the instance (every scope), through the admin API.
func (f *Forge) Runners(ctx context.Context) ([]Runner, error) {
	var all []Runner
	for page := 1; ; page++ {
		var out struct {
			Runners []struct {
				ID        int64  `json:"id"`
				Name      string `json:"name"`
				Status    string `json:"status"`
				Busy      bool   `json:"busy"`
				Disabled  bool   `json:"disabled"`
				Ephemeral bool   `json:"ephemeral"`
				Labels    []struct {
					Name string `json:"name"`
				} `json:"labels"`
			} `json:"runners"`
			TotalCount int `json:"total_count"`
		}
		if err := f.do(ctx, http.MethodGet, fmt.Sprintf("/api/v1/admin/actions/runners?page=%d&limit=50", page), nil, &out); err != nil {
			return nil, err
		}
		for _, r := range out.Runners {
			rr := Runner{ID: r.ID, Name: r.Name, Status: r.Status, Busy: r.Busy, Disabled: r.Disabled, Ephemeral: r.Ephemeral}
			for _, l := range r.Labels {
				rr.Labels = append(rr.Labels, l.Name)
			}
			all = append(all, rr)
		}
		if len(out.Runners) == 0 || len(all) >= out.TotalCount {
			return all, nil
		}
	}
}
