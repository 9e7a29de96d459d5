package github

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/actions/scaleset"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// Auth is how the controller authenticates to GitHub: a GitHub App (AppID, InstallationID and
// the App's private key in PrivateKeyFile) or a token in TokenFile (a fine-grained or classic
// personal access token, for a test organisation or GitHub Enterprise Server). Exactly one of
// the two. Credentials come only from files, never from the environment.
type Auth struct {
	// AppID is the App's numeric id or its client id (GITHUB_APP_ID).
	AppID string
	// InstallationID is the App's installation on the organisation, repository or enterprise
	// of Config.URL (GITHUB_APP_INSTALLATION_ID).
	InstallationID int64
	// PrivateKeyFile holds the App's private key, PEM (GITHUB_APP_PRIVATE_KEY_FILE).
	PrivateKeyFile string
	// TokenFile holds a token (GITHUB_TOKEN_FILE). It is read again when it changes, so an
	// operator rotates the token by replacing the file.
	TokenFile string
}

// Validate reports a missing or contradictory credential.
func (a Auth) Validate() error {
	app := a.AppID != "" || a.InstallationID != 0 || a.PrivateKeyFile != ""
	switch {
	case app && a.TokenFile != "":
		return errors.New("github: both a GitHub App (GITHUB_APP_*) and GITHUB_TOKEN_FILE are set: use one")
	case a.TokenFile != "":
		return nil
	case !app:
		return errors.New("github: no credentials: set GITHUB_APP_ID, GITHUB_APP_INSTALLATION_ID and GITHUB_APP_PRIVATE_KEY_FILE (a GitHub App), or GITHUB_TOKEN_FILE")
	case a.AppID == "" || a.InstallationID <= 0 || a.PrivateKeyFile == "":
		return errors.New("github: a GitHub App needs GITHUB_APP_ID, a positive GITHUB_APP_INSTALLATION_ID and GITHUB_APP_PRIVATE_KEY_FILE")
	}
	return nil
}

// DefaultRefresh is how often Clients makes a new client, which exchanges the credentials
// again (an installation token and the Actions-service admin token each live an hour on
// GitHub): about half their lifetime.
const DefaultRefresh = 25 * time.Minute

// ClientsConfig configures Clients.
type ClientsConfig struct {
	// URL is the organisation, repository or enterprise URL the scale sets belong to
	// (GITHUB_CONFIG_URL), e.g. https://github.com/acme.
	URL  string
	Auth Auth
	// RootCAs, when set, are the only CAs trusted for GitHub (GitHub Enterprise Server with a
	// private CA); nil trusts the system's.
	RootCAs *x509.CertPool
	// Refresh is how often a new client is made; DefaultRefresh if zero.
	Refresh time.Duration
	// Version is dynrunner's version, sent as the client's system information.
	Version string
	// Options are extra options for every client (tests shorten the retries).
	Options []scaleset.HTTPOption
	Log     zerolog.Logger
	Metrics *Metrics
	// Now is the clock; time.Now if nil.
	Now func() time.Time
}

// Clients holds the controller's scaleset.Client and makes a new one before its credentials
// age out, when the token file changes, and after GitHub refused the current one. A client
// that cannot be made is not replaced by nothing: the last good one is kept, and fails by
// itself once its own tokens expire, so a failed refresh fails closed within the tokens'
// lifetime; dynrunner_github_credential_ok says so at once.
type Clients struct {
	cfg ClientsConfig

	mu      sync.Mutex
	current *scaleset.Client
	token   string // the token file's content the current client was made with
	made    time.Time
	stale   bool // GitHub refused the current client's credentials

	rest restToken // the REST calls' installation token (rest.go)
}

// NewClients checks the configuration and makes the first client. It fails when the
// credential files cannot be read: the boot fails closed.
func NewClients(cfg ClientsConfig) (*Clients, error) {
	if cfg.URL == "" {
		return nil, errors.New("github: GITHUB_CONFIG_URL is empty: name the organisation, repository or enterprise, e.g. https://github.com/acme")
	}
	if err := cfg.Auth.Validate(); err != nil {
		return nil, err
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	c := &Clients{cfg: cfg}
	client, token, err := c.make()
	if err != nil {
		c.cfg.Metrics.CredentialOK.Set(0)
		return nil, err
	}
	c.current, c.token, c.made = client, token, cfg.Now()
	c.cfg.Metrics.CredentialOK.Set(1)
	return c, nil
}

// Client returns the client to use now, making a new one first when the current one is due
// for a refresh, was refused, or its token file changed.
func (c *Clients) Client() *scaleset.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	due := c.stale || c.cfg.Now().Sub(c.made) >= c.cfg.Refresh
	if !due && c.cfg.Auth.TokenFile != "" {
		// A rotated token file is picked up at the next call.
		if b, err := secretfile.Read(c.cfg.Auth.TokenFile); err == nil && strings.TrimSpace(string(b)) != c.token {
			due = true
		}
	}
	if !due {
		return c.current
	}
	client, token, err := c.make()
	if err != nil {
		c.cfg.Metrics.Refreshes.WithLabelValues("failed").Inc()
		c.cfg.Metrics.CredentialOK.Set(0)
		c.cfg.Log.Error().Err(err).Msg("github: refreshing the credentials failed; the last client is used until GitHub refuses it")
		return c.current
	}
	c.cfg.Metrics.Refreshes.WithLabelValues("ok").Inc()
	c.cfg.Metrics.CredentialOK.Set(1)
	c.current, c.token, c.made, c.stale = client, token, c.cfg.Now(), false
	return client
}

// HTTP is a plain HTTP client trusting what the scaleset clients trust, for the one request
// the library cannot make (Session.drop).
func (c *Clients) HTTP() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if c.cfg.RootCAs != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: c.cfg.RootCAs, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: 2 * time.Minute}
}

// Refused tells Clients that GitHub refused the current client's credentials (401, or an
// admin token GitHub no longer accepts, from which the library does not recover by itself):
// the next Client call makes a new one.
func (c *Clients) Refused() {
	c.mu.Lock()
	c.stale = true
	c.mu.Unlock()
	c.cfg.Metrics.CredentialOK.Set(0)
}

// make reads the credential files and makes a client. It calls nothing: the client
// exchanges its credentials at its first call.
func (c *Clients) make() (*scaleset.Client, string, error) {
	opts := append([]scaleset.HTTPOption{}, c.cfg.Options...)
	if c.cfg.RootCAs != nil {
		opts = append(opts, scaleset.WithRootCAs(c.cfg.RootCAs))
	}
	info := scaleset.SystemInfo{System: "dynrunner", Version: c.cfg.Version, Subsystem: "scheduler"}
	a := c.cfg.Auth
	if a.TokenFile != "" {
		b, err := secretfile.Read(a.TokenFile)
		if err != nil {
			return nil, "", fmt.Errorf("github: read GITHUB_TOKEN_FILE: %w", err)
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return nil, "", fmt.Errorf("github: GITHUB_TOKEN_FILE %s is empty", a.TokenFile)
		}
		client, err := scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{
			GitHubConfigURL: c.cfg.URL, PersonalAccessToken: token, SystemInfo: info,
		}, opts...)
		if err != nil {
			return nil, "", fmt.Errorf("github: %w", err)
		}
		return client, token, nil
	}
	key, err := secretfile.Read(a.PrivateKeyFile)
	if err != nil {
		return nil, "", fmt.Errorf("github: read GITHUB_APP_PRIVATE_KEY_FILE: %w", err)
	}
	client, err := scaleset.NewClientWithGitHubApp(scaleset.ClientWithGitHubAppConfig{
		GitHubConfigURL: c.cfg.URL,
		GitHubAppAuth:   scaleset.GitHubAppAuth{ClientID: a.AppID, InstallationID: a.InstallationID, PrivateKey: string(key)},
		SystemInfo:      info,
	}, opts...)
	if err != nil {
		return nil, "", fmt.Errorf("github: %w", err)
	}
	return client, "", nil
}

// Metrics are the GitHub forge's Prometheus metrics.
type Metrics struct {
	// CredentialOK is 1 while the last credential exchange or refresh succeeded and GitHub has
	// not refused the client since, else 0.
	CredentialOK prometheus.Gauge
	// Refreshes counts client refreshes by result (ok, failed).
	Refreshes *prometheus.CounterVec
	// SessionHeld is 1 per scale set whose message session this replica holds.
	SessionHeld *prometheus.GaugeVec
	// SessionConflicts counts session creations GitHub refused because another session of the
	// scale set exists (409).
	SessionConflicts *prometheus.CounterVec
	// Dropped counts messages acknowledged unhandled because they could not be parsed, and
	// the parts (statistics, job messages of a batch) dropped from a message handled without
	// them.
	Dropped *prometheus.CounterVec
	// SessionsRefused counts message sessions refused because GitHub's answer was a session
	// of another scale set.
	SessionsRefused *prometheus.CounterVec
	// JobsRefused counts the jobs a scale set's session refused because their runs-on labels
	// are not the scale set's (Fits): not acquired, no slot made for them.
	JobsRefused *prometheus.CounterVec
	// Reruns counts the rounds of reruns of workflow runs whose environment was lost, by
	// outcome (Outcome*).
	Reruns *prometheus.CounterVec
	// RerunErrors counts the REST calls for reruns that failed, by call (get_run, rerun).
	RerunErrors *prometheus.CounterVec
	// RerunsPending is how many workflow runs wait for their rerun (pending or asking), as
	// this replica follows them.
	RerunsPending prometheus.Gauge
}

// NewMetrics registers the metrics with reg (none when nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		CredentialOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dynrunner_github_credential_ok",
			Help: "1 while the GitHub credentials were last exchanged or refreshed successfully and GitHub has not refused them since.",
		}),
		Refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_github_credential_refreshes_total",
			Help: "GitHub client refreshes (new credential exchanges), by result.",
		}, []string{"result"}),
		SessionHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynrunner_github_session_held",
			Help: "1 for each runner scale set whose message session this replica holds.",
		}, []string{"scale_set"}),
		SessionConflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_github_session_conflicts_total",
			Help: "Message session creations GitHub refused because the scale set had another session.",
		}, []string{"scale_set"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_github_messages_dropped_total",
			Help: "Messages of a scale set's queue, or parts of one (its statistics, a job message of its batch), acknowledged unhandled because they could not be parsed.",
		}, []string{"scale_set"}),
		SessionsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_github_sessions_refused_total",
			Help: "Message sessions refused because GitHub answered with a session of another scale set.",
		}, []string{"scale_set"}),
		JobsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_github_jobs_refused_total",
			Help: "Jobs a scale set's session refused (not acquired, no slot made) because their runs-on labels are not the scale set's.",
		}, []string{"scale_set"}),
		Reruns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_github_reruns_total",
			Help: "Workflow runs whose slots lost their environment, by what came of their rerun: rerun, covered, bound, not_failed, gone, gave_up, refused.",
		}, []string{"outcome"}),
		RerunErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynrunner_github_rerun_errors_total",
			Help: "REST calls for reruns of workflow runs that failed, by call: get_run, rerun.",
		}, []string{"call"}),
		RerunsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dynrunner_github_reruns_pending",
			Help: "Workflow runs waiting for dynrunner to rerun their failed jobs (pending or asking).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.CredentialOK, m.Refreshes, m.SessionHeld, m.SessionConflicts, m.Dropped, m.SessionsRefused, m.JobsRefused, m.Reruns, m.RerunErrors, m.RerunsPending)
	}
	return m
}

// refusedCredentials reports whether err is GitHub refusing the client's credentials.
func refusedCredentials(err error) bool {
	if err == nil {
		return false
	}
	// The client's errors carry the response's status line; it exports no error for this.
	s := err.Error()
	return strings.Contains(s, `status="401`) || strings.Contains(s, "Bad credentials")
}

// scaleSetLabel is a scale set's id as a metric label.
func scaleSetLabel(id int) string { return strconv.Itoa(id) }
