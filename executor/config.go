package executor

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// The environment variables of the executor contract (docs/configuration.md, "Executor
// variables"). The pod worker sets them for each environment; `dynrunner executor` reads them
// with ParseEnv.
const (
	EnvFacadeURL      = "DYNRUNNER_FACADE_URL"
	EnvFacadeSpiffeID = "DYNRUNNER_FACADE_SPIFFE_ID"
	EnvTaskID         = "DYNRUNNER_TASK_ID"
	EnvEpoch          = "DYNRUNNER_EPOCH"
	EnvSecretsDir     = "DYNRUNNER_SECRETS_DIR"
	EnvWorkDir        = "DYNRUNNER_WORK_DIR"
	EnvForgeURL       = "DYNRUNNER_FORGE_URL"
	EnvLabels         = "DYNRUNNER_LABELS"
	EnvRenewSecs      = "DYNRUNNER_RENEW_SECS"
	EnvSpiffeSocket   = "SPIFFE_ENDPOINT_SOCKET"
	EnvLogFormat      = "LOG_FORMAT"
	EnvRunnerBin      = "GITEA_RUNNER_BIN"
	EnvRunnerSHA256   = "GITEA_RUNNER_SHA256"
	EnvRunnerVersion  = "GITEA_RUNNER_VERSION"
)

// EnvEnvDir is the variable the local pod backend sets to an environment's directory. It is
// not part of Config: the backend finds every process of an environment by it, so the executor
// leaves it in the runner's and the job's environment.
const EnvEnvDir = "DYNRUNNER_ENV_DIR"

// DefaultRenew is the lease renewal interval when the environment names none.
const DefaultRenew = 100 * time.Second

// maxRenewSecs is the longest renewal interval a time.Duration holds.
const maxRenewSecs = math.MaxInt64 / int64(time.Second)

// DefaultLogFormat is the executor's log format when the environment names none.
const DefaultLogFormat = "json"

// Labels returns the labels an environment of tiers declares at the facade, in the runner's
// `name:host` form: `self-hosted` and each tier's own (`pod`, `vm`), the labels workflows name
// in `runs-on`. A static runner that stands in for both tiers (the parity tests) declares
// Labels(assignment.BackendPod, assignment.BackendVM).
func Labels(tiers ...assignment.Backend) []string {
	labels := []string{"self-hosted:host"}
	for _, t := range tiers {
		labels = append(labels, string(t)+":host")
	}
	return labels
}

// Config is what an environment is given: the one definition of the executor contract. A pod
// environment receives it as environment variables (Environ, ParseEnv), a microVM guest as
// the grant its nonce redeems (Grant).
type Config struct {
	// FacadeURL is the facades' https URLs, comma-separated (ParseFacadeURLs): the
	// environment fails over between them (Failover).
	FacadeURL string
	// FacadeID is the SPIFFE ID the facade must present.
	FacadeID spiffeid.ID
	// Task and Epoch name the assignment the environment runs.
	Task  assignment.TaskID
	Epoch assignment.Epoch
	// SecretsDir holds the capability token (podworker.TokenFile) and, without a Workload
	// API, the SVID files.
	SecretsDir string
	// WorkDir is the work directory of the runner and the job.
	WorkDir string
	// ForgeURL is the forge's own URL, the server URL the job sees; empty when unknown.
	ForgeURL assignment.ForgeURL
	// Labels the runner declares, in the runner's `name:host` form.
	Labels []string
	// Renew is the lease renewal interval (about a third of the lease), whole seconds.
	Renew time.Duration
	// SpiffeEndpointSocket is the Workload API socket; empty: the SVID files in SecretsDir.
	SpiffeEndpointSocket string
	// LogFormat is json, or console for humans.
	LogFormat string
	// RunnerBin is the pinned Gitea runner binary, RunnerSHA256 its SHA-256 and
	// RunnerVersion the version it must report (empty: not checked).
	RunnerBin     string
	RunnerSHA256  string
	RunnerVersion string
}

// Environ encodes c as the environment variables of a pod environment: the controller's part,
// then AssignmentEnv and BackendEnv. The variables the controller sets for all environments
// are always present, empty when unset in c; the ones of one assignment or one backend (task,
// epoch, forge URL, secrets and work directories) only when set, so a worker can add them to
// the controller's.
func (c Config) Environ() map[string]string {
	env := map[string]string{
		EnvFacadeURL:      c.FacadeURL,
		EnvFacadeSpiffeID: c.FacadeID.String(),
		EnvRenewSecs:      strconv.Itoa(int(c.Renew.Seconds())),
		EnvLabels:         strings.Join(c.Labels, ","),
		EnvRunnerBin:      c.RunnerBin,
		EnvRunnerSHA256:   c.RunnerSHA256,
		EnvRunnerVersion:  c.RunnerVersion,
		EnvSpiffeSocket:   c.SpiffeEndpointSocket,
		EnvLogFormat:      c.LogFormat,
	}
	maps.Copy(env, c.AssignmentEnv())
	maps.Copy(env, c.BackendEnv())
	return env
}

// AssignmentEnv encodes the part of c that names one assignment: Task, Epoch and ForgeURL,
// each only when set. The pod worker adds it to the controller's variables (Environ of a
// Config without them).
func (c Config) AssignmentEnv() map[string]string {
	env := map[string]string{}
	if c.Task != 0 {
		env[EnvTaskID] = c.Task.String()
	}
	if c.Epoch != 0 {
		env[EnvEpoch] = c.Epoch.String()
	}
	setNonEmpty(env, EnvForgeURL, c.ForgeURL.String())
	return env
}

// BackendEnv encodes the part of c that a pod backend knows: SecretsDir, WorkDir and
// SpiffeEndpointSocket as the environment sees them, each only when set. The backend adds it
// over the worker's variables: a backend that passes a Workload API socket into the
// environment replaces the controller's address of it.
func (c Config) BackendEnv() map[string]string {
	env := map[string]string{}
	setNonEmpty(env, EnvSecretsDir, c.SecretsDir)
	setNonEmpty(env, EnvWorkDir, c.WorkDir)
	setNonEmpty(env, EnvSpiffeSocket, c.SpiffeEndpointSocket)
	return env
}

// EnvDirEntry is the environment entry (EnvEnvDir=dir) the local pod backend gives the
// executor of the environment in dir, and finds every process of that environment by.
func EnvDirEntry(dir string) string { return EnvEnvDir + "=" + dir }

func setNonEmpty(env map[string]string, k, v string) {
	if v != "" {
		env[k] = v
	}
}

// ErrNotSet: a variable the executor requires is missing or empty.
var ErrNotSet = errors.New("is not set")

// EnvError is a variable of the executor's environment that ParseEnv refused.
type EnvError struct {
	// Key is the variable.
	Key string
	// Err is why: ErrNotSet, or what its value is wrong with.
	Err error
}

func (e *EnvError) Error() string {
	if errors.Is(e.Err, ErrNotSet) {
		return e.Key + " " + e.Err.Error()
	}
	return e.Key + ": " + e.Err.Error()
}

func (e *EnvError) Unwrap() error { return e.Err }

// ParseEnv reads the executor's configuration from the environment getenv returns and
// validates it. Every refused variable is an *EnvError; all of them are reported together.
func ParseEnv(getenv func(string) string) (Config, error) {
	var errs []error
	refuse := func(key string, err error) { errs = append(errs, &EnvError{Key: key, Err: err}) }
	need := func(key string) string {
		v := getenv(key)
		if v == "" {
			refuse(key, ErrNotSet)
		}
		return v
	}
	c := Config{
		FacadeURL:            need(EnvFacadeURL),
		SecretsDir:           need(EnvSecretsDir),
		WorkDir:              need(EnvWorkDir),
		RunnerBin:            need(EnvRunnerBin),
		RunnerSHA256:         need(EnvRunnerSHA256),
		RunnerVersion:        getenv(EnvRunnerVersion),
		SpiffeEndpointSocket: getenv(EnvSpiffeSocket),
		LogFormat:            getenv(EnvLogFormat),
		Labels:               Labels(assignment.BackendPod),
		Renew:                DefaultRenew,
	}
	if c.FacadeURL != "" {
		if _, err := ParseFacadeURLs(c.FacadeURL); err != nil {
			refuse(EnvFacadeURL, err)
		}
	}
	if v := need(EnvFacadeSpiffeID); v != "" {
		id, err := spiffeid.FromString(v)
		if err != nil {
			refuse(EnvFacadeSpiffeID, err)
		}
		c.FacadeID = id
	}
	if v := need(EnvTaskID); v != "" {
		t, err := assignment.ParseTaskID(v)
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
	if v := getenv(EnvRenewSecs); v != "" {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil || n < 1:
			refuse(EnvRenewSecs, fmt.Errorf("%q: want a positive integer", v))
		case int64(n) > maxRenewSecs:
			refuse(EnvRenewSecs, fmt.Errorf("%q: want at most %d seconds", v, maxRenewSecs))
		}
		c.Renew = time.Duration(n) * time.Second
	}
	if v := getenv(EnvForgeURL); v != "" {
		f, err := assignment.ParseForgeURL(v)
		if err != nil {
			refuse(EnvForgeURL, err)
		}
		c.ForgeURL = f
	}
	if v := getenv(EnvLabels); v != "" {
		c.Labels = strings.Split(v, ",")
	}
	if c.LogFormat == "" {
		c.LogFormat = DefaultLogFormat
	}
	if len(errs) > 0 {
		return Config{}, fmt.Errorf("executor configuration: %w", errors.Join(errs...))
	}
	return c, nil
}
