package opensandbox

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/vmworker"
)

// Defaults for the optional Config fields.
const (
	DefaultPool         = "ci-vm"
	DefaultScope        = "default"
	DefaultTimeout      = 30 * time.Second
	DefaultStartTimeout = time.Minute
	DefaultPollInterval = 2 * time.Second
	DefaultSandboxTTL   = 6 * time.Hour
	DefaultRetries      = 4
	DefaultRetryBase    = 500 * time.Millisecond
	DefaultRetryMax     = 10 * time.Second
	DefaultMaxRetryWait = time.Minute
)

// The sandbox timeout (TTL) bounds of the published API: timeout is 60 to 86400 seconds.
const (
	MinSandboxTTL = time.Minute
	MaxSandboxTTL = 24 * time.Hour
)

// DefaultEntrypoint is the sandbox's entry process: the guest runner, which redeems the nonce
// named by EnvInstanceID, EnvNonce and EnvEndpoint.
var DefaultEntrypoint = []string{"dynrunner", "guest"}

// DefaultResources are the resourceLimits sent with every create. The published API requires
// the field; servers creating from a pool use the pool's resources instead.
var DefaultResources = map[string]string{"cpu": "2", "memory": "4Gi"}

// Config configures a Backend. The caller fills it; the backend reads no environment variables
// and no files.
type Config struct {
	// BaseURL is the Lifecycle API's server URL, e.g. https://opensandbox.example/v1. A URL
	// without a path gets the API's "/v1".
	BaseURL string
	// APIKey is the key sent in the OPEN-SANDBOX-API-KEY header, as read from the key file;
	// surrounding white space (a trailing newline) is dropped.
	APIKey []byte
	// Pool is the pre-warmed pool sandboxes come from, sent as extensions.poolRef
	// (DefaultPool when empty).
	Pool string
	// Image is the sandbox image URI. Empty leaves it to the pool, which servers accept with
	// extensions.poolRef.
	Image string
	// Entrypoint is the sandbox's entry process (DefaultEntrypoint when empty).
	Entrypoint []string
	// Resources are the resourceLimits sent with every create (DefaultResources when nil).
	Resources map[string]string
	// SandboxTTL is the sandbox timeout: the server deletes the sandbox this long after its
	// creation whatever happens (DefaultSandboxTTL when zero; whole seconds, 1m to 24h).
	SandboxTTL time.Duration
	// Scope separates the sandboxes of several dynrunner installations on one OpenSandbox
	// server: List and the reaper only see their own scope (DefaultScope when empty).
	Scope string
	// Nonces issues the nonces sandboxes redeem for their credential. Required.
	Nonces *vmworker.Nonces
	// Endpoint is the nonce endpoint's URL as sandboxes reach it (http://host:port). Required.
	Endpoint string
	// Timeout bounds each HTTP request (DefaultTimeout when zero).
	Timeout time.Duration
	// StartTimeout bounds how long Start waits for a new sandbox to become Running; a sandbox
	// that is not Running by then is deleted (DefaultStartTimeout when zero). Keep it well
	// below the assignment's pickup timeout, which also covers the guest's registration.
	StartTimeout time.Duration
	// PollInterval is the pause between state polls (DefaultPollInterval when zero).
	PollInterval time.Duration
	// Retries is how often a request that met a 5xx, a 429, a timeout or a transport error is
	// tried again (DefaultRetries when zero, none when negative).
	Retries int
	// RetryBase and RetryMax bound the exponential backoff between retries (DefaultRetryBase,
	// DefaultRetryMax when zero).
	RetryBase, RetryMax time.Duration
	// MaxRetryWait is the longest Retry-After the backend waits out; a longer one fails the
	// request with ErrRateLimited (DefaultMaxRetryWait when zero).
	MaxRetryWait time.Duration
	// HTTPClient sends the requests (a client with its own transport when nil). Its Timeout
	// should be zero: Timeout bounds each request.
	HTTPClient *http.Client
	// Log receives the backend's structured log.
	Log zerolog.Logger
}

// Sentinel errors of New and Start; callers branch on them with errors.Is.
var (
	// ErrInvalidConfig reports a Config New refuses.
	ErrInvalidConfig = errors.New("opensandbox: invalid configuration")
	// ErrInvalidSpec reports a Spec Start refuses (not exactly one credential, bad task or epoch);
	// retrying cannot help.
	ErrInvalidSpec = errors.New("opensandbox: invalid spec")
	// ErrInvalidHandle reports a Handle that is not an opensandbox one or names no safe id.
	ErrInvalidHandle = errors.New("opensandbox: invalid handle")
)

var (
	// dnsLabelRe is a Kubernetes resource name (a pool's name).
	dnsLabelRe = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	// labelValueRe is a Kubernetes label value; the server checks metadata values against it.
	labelValueRe = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
)

// normalize validates cfg and fills its defaults.
func (cfg Config) normalize() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	base, err := parseBaseURL(cfg.BaseURL)
	if err != nil {
		return bad("%v", err)
	}
	cfg.BaseURL = base
	cfg.APIKey = bytes.TrimSpace(cfg.APIKey)
	if len(cfg.APIKey) == 0 {
		return bad("the API key is empty (is the key file empty?)")
	}
	for _, c := range cfg.APIKey {
		if c < 0x21 || c > 0x7e {
			return bad("the API key holds a character that cannot go into an HTTP header (white space or a control or non-ASCII byte)")
		}
	}
	cfg.Pool = cmp.Or(cfg.Pool, DefaultPool)
	if !dnsLabelRe.MatchString(cfg.Pool) {
		return bad("pool %q is not a Kubernetes resource name (lowercase letters, digits and '-', at most 63)", cfg.Pool)
	}
	cfg.Scope = cmp.Or(cfg.Scope, DefaultScope)
	if !labelValueRe.MatchString(cfg.Scope) {
		return bad("scope %q is not a Kubernetes label value (letters, digits, '-', '_', '.', at most 63)", cfg.Scope)
	}
	if strings.TrimSpace(cfg.Image) != cfg.Image {
		return bad("image %q has surrounding white space", cfg.Image)
	}
	if len(cfg.Entrypoint) == 0 {
		cfg.Entrypoint = DefaultEntrypoint
	}
	cfg.Entrypoint = slices.Clone(cfg.Entrypoint)
	if slices.Contains(cfg.Entrypoint, "") {
		return bad("entrypoint %q has an empty element", cfg.Entrypoint)
	}
	if cfg.Resources == nil {
		cfg.Resources = DefaultResources
	}
	cfg.Resources = maps.Clone(cfg.Resources)
	for k, v := range cfg.Resources {
		if k == "" || v == "" {
			return bad("resource limit %q=%q: want a name and a value", k, v)
		}
	}
	if cfg.SandboxTTL == 0 {
		cfg.SandboxTTL = DefaultSandboxTTL
	}
	if cfg.SandboxTTL < MinSandboxTTL || cfg.SandboxTTL > MaxSandboxTTL || cfg.SandboxTTL%time.Second != 0 {
		return bad("sandbox TTL %v: want whole seconds from %v to %v", cfg.SandboxTTL, MinSandboxTTL, MaxSandboxTTL)
	}
	if cfg.Nonces == nil {
		return bad("no nonce issuer")
	}
	if u, err := url.Parse(cfg.Endpoint); err != nil || u.Scheme != "http" || u.Host == "" || u.User != nil {
		return bad("nonce endpoint %q: want http://host:port as sandboxes reach it", cfg.Endpoint)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"timeout", &cfg.Timeout, DefaultTimeout},
		{"start timeout", &cfg.StartTimeout, DefaultStartTimeout},
		{"poll interval", &cfg.PollInterval, DefaultPollInterval},
		{"retry base", &cfg.RetryBase, DefaultRetryBase},
		{"retry max", &cfg.RetryMax, DefaultRetryMax},
		{"max retry wait", &cfg.MaxRetryWait, DefaultMaxRetryWait},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
		if *d.v < 0 {
			return bad("%s %v is negative", d.name, *d.v)
		}
	}
	switch {
	case cfg.Retries == 0:
		cfg.Retries = DefaultRetries
	case cfg.Retries < 0:
		cfg.Retries = 0
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	return cfg, nil
}

// parseBaseURL checks the server URL and gives it the API's /v1 when it has no path.
func parseBaseURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// The text is not echoed: it might hold a secret.
		return "", errors.New("the server URL does not parse: want http(s)://host[:port][/v1]")
	}
	// shown is the URL without anything that might be secret.
	shown := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("server URL %q: want http(s)://host[:port][/v1]", shown)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("server URL %q: credentials, query and fragment do not belong in it (the API key comes from its file)", shown)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	if u.Path == "" {
		u.Path = "/v1"
	}
	u.RawPath = ""
	return u.String(), nil
}
