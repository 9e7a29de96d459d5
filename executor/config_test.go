package executor

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// full is a Config with every field set, as an environment of the local backend gets it.
func full() Config {
	return Config{
		FacadeURL:            "https://127.0.0.1:8443",
		FacadeID:             spiffeid.RequireFromString("spiffe://dynrunner.test/dynrunner/facade"),
		Task:                 7,
		Epoch:                42,
		SecretsDir:           "/envs/7-42/secrets",
		WorkDir:              "/envs/7-42/work",
		ForgeURL:             "https://gitea.example.com",
		Labels:               Labels(assignment.BackendPod),
		Renew:                90 * time.Second,
		SpiffeEndpointSocket: "unix:///run/spire/agent.sock",
		LogFormat:            "console",
		RunnerBin:            "/opt/gitea-runner",
		RunnerSHA256:         strings.Repeat("ab", 32),
		RunnerVersion:        "v1.0.8",
	}
}

func getenv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

func TestConfigRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"full", func(*Config) {}},
		{"vm labels", func(c *Config) { c.Labels = Labels(assignment.BackendVM) }},
		{"no forge url, workload api or runner version", func(c *Config) {
			c.ForgeURL, c.SpiffeEndpointSocket, c.RunnerVersion = "", "", ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := full()
			tc.edit(&want)
			got, err := ParseEnv(getenv(want.Environ()))
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

// TestEnvironNames: the variable names are the contract the pod worker's environments and
// docs/configuration.md share; the controller's part is always present, even empty.
func TestEnvironNames(t *testing.T) {
	assert.ElementsMatch(t, []string{
		EnvForgeURL, EnvEpoch, EnvFacadeSpiffeID, EnvFacadeURL, EnvLabels, EnvRenewSecs, EnvSecretsDir, EnvTaskID,
		EnvWorkDir, EnvRunnerBin, EnvRunnerSHA256, EnvRunnerVersion, EnvLogFormat, EnvSpiffeSocket,
	}, slices.Collect(maps.Keys(full().Environ())))
	assert.Equal(t, map[string]string{
		EnvFacadeURL: "", EnvFacadeSpiffeID: "", EnvRenewSecs: "0", EnvLabels: "", EnvRunnerBin: "",
		EnvRunnerSHA256: "", EnvRunnerVersion: "", EnvSpiffeSocket: "", EnvLogFormat: "",
	}, Config{}.Environ())
	env := full().Environ()
	assert.Equal(t, "self-hosted:host,pod:host", env[EnvLabels])
	assert.Equal(t, "90", env[EnvRenewSecs])
	assert.Equal(t, "7", env[EnvTaskID])
	assert.Equal(t, "42", env[EnvEpoch])
}

// TestEnvironParts: the controller's variables, the worker's AssignmentEnv and the backend's
// BackendEnv, merged in that order as an environment gets them, are Environ of the whole
// configuration, and ParseEnv gives the whole configuration back. Each part holds its own
// variables only, and none that is unset.
func TestEnvironParts(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"full", func(*Config) {}},
		{"no forge url", func(c *Config) { c.ForgeURL = "" }},
		{"no workload api", func(c *Config) { c.SpiffeEndpointSocket = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := full()
			tc.edit(&want)
			controller := want
			controller.Task, controller.Epoch, controller.ForgeURL = 0, 0, ""
			controller.SecretsDir, controller.WorkDir = "", ""
			assign := Config{Task: want.Task, Epoch: want.Epoch, ForgeURL: want.ForgeURL}.AssignmentEnv()
			backend := Config{SecretsDir: want.SecretsDir, WorkDir: want.WorkDir, SpiffeEndpointSocket: want.SpiffeEndpointSocket}.BackendEnv()
			env := controller.Environ()
			maps.Copy(env, assign)
			maps.Copy(env, backend)
			require.Equal(t, want.Environ(), env)
			got, err := ParseEnv(getenv(env))
			require.NoError(t, err)
			require.Equal(t, want, got)
			for k, v := range assign {
				assert.Contains(t, []string{EnvTaskID, EnvEpoch, EnvForgeURL}, k)
				assert.NotEmpty(t, v, k)
			}
			for k, v := range backend {
				assert.Contains(t, []string{EnvSecretsDir, EnvWorkDir, EnvSpiffeSocket}, k)
				assert.NotEmpty(t, v, k)
			}
		})
	}
	assert.Empty(t, Config{}.AssignmentEnv())
	assert.Empty(t, Config{}.BackendEnv())
	assert.Equal(t, map[string]string{EnvTaskID: "7", EnvEpoch: "42", EnvForgeURL: "https://gitea.example.com"}, full().AssignmentEnv())
	assert.Equal(t, map[string]string{
		EnvSecretsDir: "/envs/7-42/secrets", EnvWorkDir: "/envs/7-42/work", EnvSpiffeSocket: "unix:///run/spire/agent.sock",
	}, full().BackendEnv())
	assert.Equal(t, "DYNRUNNER_ENV_DIR=/envs/7-42", EnvDirEntry("/envs/7-42"))
}

func TestParseEnvDefaults(t *testing.T) {
	env := full().Environ()
	for _, k := range []string{EnvLabels, EnvRenewSecs, EnvLogFormat, EnvForgeURL, EnvRunnerVersion, EnvSpiffeSocket} {
		delete(env, k)
	}
	got, err := ParseEnv(getenv(env))
	require.NoError(t, err)
	assert.Equal(t, []string{"self-hosted:host", "pod:host"}, got.Labels)
	assert.Equal(t, DefaultRenew, got.Renew)
	assert.Equal(t, "json", got.LogFormat)
	assert.Empty(t, got.ForgeURL)
}

func TestParseEnvRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     map[string]string
		refused []string // the variables named
		notSet  bool
	}{
		{"no facade url", map[string]string{EnvFacadeURL: ""}, []string{EnvFacadeURL}, true},
		{"no facade id", map[string]string{EnvFacadeSpiffeID: ""}, []string{EnvFacadeSpiffeID}, true},
		{"no task", map[string]string{EnvTaskID: ""}, []string{EnvTaskID}, true},
		{"no epoch", map[string]string{EnvEpoch: ""}, []string{EnvEpoch}, true},
		{"no secrets dir", map[string]string{EnvSecretsDir: ""}, []string{EnvSecretsDir}, true},
		{"no work dir", map[string]string{EnvWorkDir: ""}, []string{EnvWorkDir}, true},
		{"no runner", map[string]string{EnvRunnerBin: ""}, []string{EnvRunnerBin}, true},
		{"no runner sha", map[string]string{EnvRunnerSHA256: ""}, []string{EnvRunnerSHA256}, true},
		{"all missing at once", map[string]string{EnvFacadeURL: "", EnvTaskID: "", EnvRunnerBin: ""}, []string{EnvFacadeURL, EnvRunnerBin, EnvTaskID}, true},
		{"plain http facade", map[string]string{EnvFacadeURL: "http://127.0.0.1:8443"}, []string{EnvFacadeURL}, false},
		{"facade without host", map[string]string{EnvFacadeURL: "https://"}, []string{EnvFacadeURL}, false},
		{"facade list with a plain http entry", map[string]string{EnvFacadeURL: "https://a:1,http://b:1"}, []string{EnvFacadeURL}, false},
		{"facade id not spiffe", map[string]string{EnvFacadeSpiffeID: "https://dynrunner.test/facade"}, []string{EnvFacadeSpiffeID}, false},
		{"task not a number", map[string]string{EnvTaskID: "7;rm"}, []string{EnvTaskID}, false},
		{"task negative", map[string]string{EnvTaskID: "-7"}, []string{EnvTaskID}, false},
		{"epoch not a number", map[string]string{EnvEpoch: "x"}, []string{EnvEpoch}, false},
		{"renew zero", map[string]string{EnvRenewSecs: "0"}, []string{EnvRenewSecs}, false},
		{"renew negative", map[string]string{EnvRenewSecs: "-100"}, []string{EnvRenewSecs}, false},
		{"renew a duration", map[string]string{EnvRenewSecs: "100s"}, []string{EnvRenewSecs}, false},
		{"renew beyond a duration", map[string]string{EnvRenewSecs: "9223372037"}, []string{EnvRenewSecs}, false},
		{"forge url not http", map[string]string{EnvForgeURL: "ftp://gitea.example.com"}, []string{EnvForgeURL}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := full().Environ()
			maps.Copy(env, tc.set)
			got, err := ParseEnv(getenv(env))
			require.Error(t, err)
			assert.Equal(t, Config{}, got)
			var named []string
			for _, e := range err.(interface{ Unwrap() error }).Unwrap().(interface{ Unwrap() []error }).Unwrap() {
				var ee *EnvError
				require.ErrorAs(t, e, &ee)
				named = append(named, ee.Key)
			}
			assert.ElementsMatch(t, tc.refused, named)
			assert.Equal(t, tc.notSet, errors.Is(err, ErrNotSet))
			assert.ErrorContains(t, err, "executor configuration: ")
		})
	}
}

func TestLabels(t *testing.T) {
	assert.Equal(t, []string{"self-hosted:host", "pod:host"}, Labels(assignment.BackendPod))
	assert.Equal(t, []string{"self-hosted:host", "vm:host"}, Labels(assignment.BackendVM))
	assert.Equal(t, []string{"self-hosted:host", "pod:host", "vm:host"}, Labels(assignment.BackendPod, assignment.BackendVM))
	// Each call is a fresh slice: a caller appending to its labels changes no one else's.
	a := Labels(assignment.BackendPod)
	a[0] = "x"
	assert.Equal(t, "self-hosted:host", Labels(assignment.BackendPod)[0])
}

// FuzzParseEnv: whatever environment the executor starts in, a configuration it accepts
// names a valid assignment and facade and encodes back to itself.
func FuzzParseEnv(f *testing.F) {
	e := full().Environ()
	f.Add(e[EnvFacadeURL], e[EnvFacadeSpiffeID], e[EnvTaskID], e[EnvEpoch], e[EnvRenewSecs], e[EnvForgeURL], e[EnvLabels])
	f.Add("https://h:1", "spiffe://td/x", "1", "1", "", "", "")
	f.Add("http://h", "spiffe://td", "-1", "0", "0", "ftp://x", ",,")
	f.Add("https://h:1", "spiffe://td/x", "1", "1", "9223372037", "", "")
	f.Fuzz(func(t *testing.T, facadeURL, facadeID, task, epoch, renew, forge, labels string) {
		env := full().Environ()
		maps.Copy(env, map[string]string{
			EnvFacadeURL: facadeURL, EnvFacadeSpiffeID: facadeID, EnvTaskID: task, EnvEpoch: epoch,
			EnvRenewSecs: renew, EnvForgeURL: forge, EnvLabels: labels,
		})
		c, err := ParseEnv(getenv(env))
		if err != nil {
			require.Equal(t, Config{}, c)
			return
		}
		require.Positive(t, int64(c.Task))
		require.Positive(t, uint64(c.Epoch))
		require.False(t, c.FacadeID.IsZero())
		require.GreaterOrEqual(t, c.Renew, time.Second)
		again, err := ParseEnv(getenv(c.Environ()))
		require.NoError(t, err)
		require.Equal(t, c, again)
	})
}
