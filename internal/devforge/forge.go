package devforge

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/rs/zerolog"
)

// DefaultStartTimeout bounds [Start] when ctx has no earlier deadline.
const DefaultStartTimeout = 2 * time.Minute

// AdminUser is the site administrator [Start] creates; repositories are created under it.
const AdminUser = "devadmin"

// Options configure [Start].
type Options struct {
	// Dir holds all of Gitea's state (app.ini, sqlite database, repositories), e.g. t.TempDir().
	// Starting again on the same Dir reuses the database, the admin user and its token.
	Dir string
	// Output receives Gitea's stdout and stderr (warnings and errors only); nil discards them.
	Output io.Writer
	// Logger receives devforge's own progress messages; the zero value is silent.
	Logger zerolog.Logger
	// Addr is the address Gitea listens on and names in its ROOT_URL (default 127.0.0.1), on a
	// free port. With Netns, gitea web runs in that network namespace (`ip netns exec`, so
	// root) on Addr, port 3000: a forge on another host, as environments reach it in
	// production; Addr must then be an address of the namespace reachable from the caller's.
	Netns string
	Addr  string
	// Listen, with Netns, is the address gitea web listens on inside the namespace when it is
	// not Addr: a proxy of the caller's then serves Addr:3000 (ROOT_URL) and forwards there.
	// The proxy must answer before Start is called.
	Listen string
}

// Forge is a running development Gitea. Close stops it.
type Forge struct {
	url    string
	addr   string
	listen string
	netns  string
	dir    string
	state  forgeState
	client *http.Client
	log    zerolog.Logger
	proc   *process
}

// forgeState is kept in Dir so a restart on the same Dir keeps its secrets and credentials.
type forgeState struct {
	SecretKey     string `json:"secret_key"`
	InternalToken string `json:"internal_token"`
	JWTSecret     string `json:"jwt_secret"`
	AdminPassword string `json:"admin_password"`
	AdminToken    string `json:"admin_token"`
}

const stateFile = "devforge.json"

// Start runs `gitea web` from tools with its state in opts.Dir on a free loopback port and
// returns once the API answers and an admin user with an all-scopes token exists. Start is bounded by ctx and at most [DefaultStartTimeout].
//
// Measured on the project's 2-core machine: 1.7-3.9 s for a fresh Dir (migrate, admin user,
// web), 0.7-1.0 s on a reused Dir.
func Start(ctx context.Context, tools Tools, opts Options) (*Forge, error) {
	if opts.Dir == "" {
		return nil, errors.New("devforge: Options.Dir is required")
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultStartTimeout)
	defer cancel()
	began := time.Now()

	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("devforge: state dir: %w", err)
	}
	for _, d := range []string{"custom/conf", "data", "log", "repos"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("devforge: state dir: %w", err)
		}
	}
	st, fresh, err := loadOrNewState(dir)
	if err != nil {
		return nil, err
	}

	f := &Forge{
		dir:    dir,
		state:  st,
		client: &http.Client{Timeout: 30 * time.Second},
		log:    opts.Logger,
		addr:   "127.0.0.1",
		netns:  opts.Netns,
		listen: opts.Listen,
	}
	if opts.Addr != "" {
		f.addr = opts.Addr
	}
	if opts.Netns != "" && opts.Addr == "" {
		return nil, errors.New("devforge: Options.Netns needs Options.Addr, the namespace's address")
	}
	if opts.Listen != "" && opts.Netns == "" {
		return nil, errors.New("devforge: Options.Listen needs Options.Netns")
	}
	if fresh {
		// The CLI commands need an app.ini; they do not listen, so any port will do.
		if err := f.writeAppINI(tools, 3000); err != nil {
			return nil, err
		}
		if _, err := f.gitea(ctx, tools, "migrate"); err != nil {
			return nil, err
		}
		if err := f.createAdmin(ctx, tools); err != nil {
			return nil, err
		}
		if err := f.saveState(); err != nil {
			return nil, err
		}
	}

	// Gitea cannot be handed a listening socket (with LISTEN_FDS it sends SIGTERM to its parent,
	// taking it for an old Gitea to replace), so pick a free port and retry if another process
	// takes it first.
	for attempt := 1; ; attempt++ {
		err := f.startWeb(ctx, tools, opts.Output)
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return nil, err
		}
		f.log.Debug().Err(err).Msg("devforge: port taken, retrying")
	}
	f.log.Info().Str("url", f.url).Dur("took", time.Since(began)).Bool("fresh", fresh).Msg("devforge: gitea ready")
	return f, nil
}

// URL is Gitea's base URL without a trailing slash, e.g. http://127.0.0.1:41234.
func (f *Forge) URL() string { return f.url }

// Token is the admin user's access token (all scopes), for API calls devforge does not wrap.
func (f *Forge) Token() string { return f.state.AdminToken }

// Dir is the absolute state directory.
func (f *Forge) Dir() string { return f.dir }

// Close stops Gitea: SIGTERM, then SIGKILL after a bound. It is idempotent.
func (f *Forge) Close() error {
	if f == nil || f.proc == nil {
		return nil
	}
	return f.proc.stop()
}

// errPortTaken means gitea web could not bind the port devforge picked.
var errPortTaken = errors.New("devforge: port taken")

// startWeb starts gitea web on a free port and waits until it is healthy.
func (f *Forge) startWeb(ctx context.Context, tools Tools, output io.Writer) error {
	port := 3000 // nothing else listens in a namespace of its own
	if f.netns == "" {
		var err error
		if port, err = freePort(f.addr); err != nil {
			return err
		}
	}
	f.url = "http://" + net.JoinHostPort(f.addr, strconv.Itoa(port))
	if err := f.writeAppINI(tools, port); err != nil {
		return err
	}
	cmd := f.giteaCmd(context.Background(), tools, "web", "--quiet")
	if f.netns != "" {
		cmd.Args = append([]string{"ip", "netns", "exec", f.netns}, cmd.Args...)
		p, err := exec.LookPath("ip")
		if err != nil {
			return fmt.Errorf("devforge: %w", err)
		}
		cmd.Path = p
	}
	// gitea web lives until Close, not until ctx ends.
	var err error
	f.proc, err = startProcess("gitea web", cmd, output)
	if err != nil {
		return err
	}
	if err := f.waitHealthy(ctx); err != nil {
		_ = f.proc.stop()
		if strings.Contains(f.proc.tail.String(), "address already in use") {
			return fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return err
	}
	return nil
}

func freePort(addr string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("devforge: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func loadOrNewState(dir string) (forgeState, bool, error) {
	var st forgeState
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &st); err != nil {
			return st, false, fmt.Errorf("devforge: read %s: %w", stateFile, err)
		}
		return st, false, nil
	case !errors.Is(err, os.ErrNotExist):
		return st, false, fmt.Errorf("devforge: read %s: %w", stateFile, err)
	}
	st.SecretKey = randomHex(32)
	st.InternalToken = randomHex(48)
	st.AdminPassword = randomHex(16)
	jwt := make([]byte, 32)
	_, _ = rand.Read(jwt)
	st.JWTSecret = base64.RawURLEncoding.EncodeToString(jwt)
	return st, true, nil
}

func (f *Forge) saveState() error {
	b, err := json.MarshalIndent(f.state, "", "  ")
	if err != nil {
		return fmt.Errorf("devforge: save state: %w", err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, stateFile), b, 0o600); err != nil {
		return fmt.Errorf("devforge: save state: %w", err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

var appINI = template.Must(template.New("app.ini").Parse(`; written by devforge, rewritten on every start
APP_NAME = dynrunner devforge
RUN_MODE = prod
WORK_PATH = {{.Dir}}

[server]
PROTOCOL = http
HTTP_ADDR = {{.Listen}}
HTTP_PORT = {{.Port}}
ROOT_URL = {{.URL}}/
DOMAIN = {{.Addr}}
APP_DATA_PATH = {{.Dir}}/data
STATIC_ROOT_PATH = {{.StaticRoot}}
DISABLE_SSH = true
START_SSH_SERVER = false
OFFLINE_MODE = true
LFS_START_SERVER = false

[database]
DB_TYPE = sqlite3
PATH = {{.Dir}}/data/gitea.db
SQLITE_JOURNAL_MODE = WAL

[repository]
ROOT = {{.Dir}}/repos
DEFAULT_BRANCH = main

[security]
INSTALL_LOCK = true
SECRET_KEY = {{.SecretKey}}
INTERNAL_TOKEN = {{.InternalToken}}
PASSWORD_HASH_ALGO = pbkdf2

[oauth2]
JWT_SECRET = {{.JWTSecret}}

[service]
DISABLE_REGISTRATION = true
REQUIRE_SIGNIN_VIEW = false
ENABLE_NOTIFY_MAIL = false

[mailer]
ENABLED = false

[session]
PROVIDER = memory

[indexer]
ISSUE_INDEXER_TYPE = db
REPO_INDEXER_ENABLED = false

[cron.update_checker]
ENABLED = false

[actions]
ENABLED = true

[log]
MODE = console
LEVEL = Warn
ROOT_PATH = {{.Dir}}/log
`))

func (f *Forge) writeAppINI(tools Tools, port int) error {
	var buf bytes.Buffer
	err := appINI.Execute(&buf, map[string]any{
		"Dir":           f.dir,
		"Port":          port,
		"Addr":          f.addr,
		"Listen":        cmp.Or(f.listen, f.addr),
		"URL":           "http://" + net.JoinHostPort(f.addr, strconv.Itoa(port)),
		"StaticRoot":    tools.GiteaDir,
		"SecretKey":     f.state.SecretKey,
		"InternalToken": f.state.InternalToken,
		"JWTSecret":     f.state.JWTSecret,
	})
	if err != nil {
		return fmt.Errorf("devforge: app.ini: %w", err)
	}
	if err := os.WriteFile(f.appINIPath(), buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("devforge: app.ini: %w", err)
	}
	return nil
}

func (f *Forge) appINIPath() string { return filepath.Join(f.dir, "custom", "conf", "app.ini") }

// giteaCmd prepares `gitea <args>` against this forge's state directory.
func (f *Forge) giteaCmd(ctx context.Context, tools Tools, args ...string) *exec.Cmd {
	full := append([]string{"--work-path", f.dir, "--custom-path", filepath.Join(f.dir, "custom"), "--config", f.appINIPath()}, args...)
	cmd := exec.CommandContext(ctx, tools.GiteaBin, full...)
	cmd.Dir = f.dir
	cmd.Env = append(os.Environ(),
		"GITEA_WORK_DIR="+f.dir,
		"GITEA_CUSTOM="+filepath.Join(f.dir, "custom"),
		"GITEA_I_AM_BEING_UNSAFE_RUNNING_AS_ROOT=true",
	)
	return cmd
}

// gitea runs a one-shot gitea CLI command and returns its stdout.
func (f *Forge) gitea(ctx context.Context, tools Tools, args ...string) (string, error) {
	cmd := f.giteaCmd(ctx, tools, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("devforge: gitea %s: %w: %s%s", args[0], err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

func (f *Forge) createAdmin(ctx context.Context, tools Tools) error {
	out, err := f.gitea(ctx, tools, "admin", "user", "create",
		"--username", AdminUser, "--password", f.state.AdminPassword,
		"--email", AdminUser+"@devforge.invalid", "--admin", "--must-change-password=false",
		"--access-token", "--access-token-name", "devforge", "--access-token-scopes", "all")
	if err != nil {
		return err
	}
	const marker = "Access token was successfully created... "
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if tok, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), marker); ok {
			f.state.AdminToken = strings.TrimSpace(tok)
			return nil
		}
	}
	return fmt.Errorf("devforge: gitea admin user create printed no access token: %q", out)
}

// waitHealthy polls /api/healthz until it answers 200, the process dies or ctx ends.
func (f *Forge) waitHealthy(ctx context.Context) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if f.proc.exited() {
			return f.proc.exitError()
		}
		resp, err := f.probe(ctx)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("devforge: gitea not healthy at %s (last: %w): %w; output:\n%s", f.url, last, ctx.Err(), f.proc.tail.String())
		case <-f.proc.done:
		case <-tick.C:
		}
	}
}

func (f *Forge) probe(ctx context.Context) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/api/healthz", nil)
	if err != nil {
		return nil, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, err
	}
	// Read the (small) body inside the timeout.
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, err
}
