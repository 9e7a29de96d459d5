package executor

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// guestPart is full() as a grant carries it: no secrets directory, work directory, runner
// path, Workload API socket or log format, which are the guest's own.
func guestPart() Config {
	c := full()
	c.Labels = Labels(assignment.BackendVM)
	c.SecretsDir, c.WorkDir, c.RunnerBin, c.SpiffeEndpointSocket, c.LogFormat = "", "", "", "", ""
	return c
}

// TestGrantWireFormat pins the JSON a guest receives: the guest and the vm worker of one
// release agree on it, and a guest image built from an older tree must still read it.
func TestGrantWireFormat(t *testing.T) {
	data, err := json.Marshal(NewGrant(full(), "drc1.tok", []byte("CA PEM")))
	require.NoError(t, err)
	assert.JSONEq(t, `{
		"task_id": 7, "epoch": 42, "token": "drc1.tok",
		"facade_url": "https://127.0.0.1:8443", "facade_spiffe_id": "spiffe://dynrunner.test/dynrunner/facade",
		"facade_ca_pem": "CA PEM", "runner_path": "/v1/runner",
		"runner_sha256": "abababababababababababababababababababababababababababababababab", "runner_version": "v1.0.8",
		"labels": ["self-hosted:host", "pod:host"], "renew_secs": 90, "forge_url": "https://gitea.example.com"
	}`, string(data))

	c := full()
	c.ForgeURL = ""
	data, err = json.Marshal(NewGrant(c, "drc1.tok", nil))
	require.NoError(t, err)
	assert.NotContains(t, string(data), "forge_url", "an unknown forge URL is left out")
}

func TestGrantRoundTrip(t *testing.T) {
	want := guestPart()
	data, err := json.Marshal(NewGrant(want, "drc1.tok", []byte("CA")))
	require.NoError(t, err)
	var g Grant
	require.NoError(t, json.Unmarshal(data, &g))
	got, err := g.Config()
	require.NoError(t, err)
	require.Equal(t, want, got)
	assert.Equal(t, "drc1.tok", g.Token)
	assert.Equal(t, "CA", g.FacadeCAPEM)
}

func TestGrantConfigDefaultsRenew(t *testing.T) {
	for _, secs := range []int{0, -5} {
		g := NewGrant(guestPart(), "t", nil)
		g.RenewSecs = secs
		c, err := g.Config()
		require.NoError(t, err)
		assert.Equal(t, DefaultRenew, c.Renew)
	}
}

func TestGrantConfigRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Grant)
	}{
		{"no task", func(g *Grant) { g.TaskID = 0 }},
		{"negative task", func(g *Grant) { g.TaskID = -7 }},
		{"no epoch", func(g *Grant) { g.Epoch = 0 }},
		{"no facade id", func(g *Grant) { g.FacadeSpiffeID = "" }},
		{"facade id not spiffe", func(g *Grant) { g.FacadeSpiffeID = "https://dynrunner.test/facade" }},
		{"forge url not http", func(g *Grant) { g.ForgeURL = "file:///etc/passwd" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGrant(guestPart(), "t", nil)
			tc.edit(&g)
			c, err := g.Config()
			require.Error(t, err)
			assert.Equal(t, Config{}, c)
		})
	}
}

// FuzzGrantConfig: whatever a nonce endpoint answers, a grant the guest accepts names a
// valid assignment and facade, and encodes back to the same contract.
func FuzzGrantConfig(f *testing.F) {
	good, _ := json.Marshal(NewGrant(guestPart(), "t", nil))
	f.Add(good)
	f.Add([]byte(`{"task_id": -1}`))
	f.Add([]byte(`{"task_id": 1, "epoch": 1, "facade_spiffe_id": "spiffe://a/b", "renew_secs": 9223372036}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var g Grant
		if json.Unmarshal(data, &g) != nil {
			return
		}
		c, err := g.Config()
		if err != nil {
			return
		}
		require.Positive(t, int64(c.Task))
		require.Positive(t, uint64(c.Epoch))
		require.False(t, c.FacadeID.IsZero())
		require.Positive(t, c.Renew)
		again, err := NewGrant(c, g.Token, nil).Config()
		require.NoError(t, err)
		if c.Renew%time.Second == 0 && c.Renew > 0 {
			require.Equal(t, c, again)
		}
	})
}

// TestGitHubGrant pins a GitHub slot's grant: its slot, the JIT configuration and the runner
// pinned in the guest image, nothing of the facade; it decodes to the slot's GitHubConfig and
// is no Gitea grant.
func TestGitHubGrant(t *testing.T) {
	sha := strings.Repeat("cd", 32)
	slot := assignment.SlotBase + 9
	want := GitHubConfig{Task: slot, Epoch: 42, RunnerBin: "/opt/actions-runner/run.sh", RunnerSHA256: sha}
	g := NewGitHubGrant(want, "JIT")
	data, err := json.Marshal(g)
	require.NoError(t, err)
	assert.JSONEq(t, `{
		"task_id": 4503599627370505, "epoch": 42, "token": "", "facade_url": "", "facade_spiffe_id": "", "facade_ca_pem": "",
		"runner_path": "", "runner_sha256": "", "runner_version": "", "labels": null, "renew_secs": 0,
		"github": {"jit_config": "JIT", "runner_bin": "/opt/actions-runner/run.sh", "runner_sha256": "`+sha+`"}
	}`, string(data))
	var back Grant
	require.NoError(t, json.Unmarshal(data, &back))
	assert.True(t, back.IsGitHub())
	got, jit, err := back.GitHubConfig()
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, "JIT", jit)
	_, err = back.Config()
	assert.ErrorContains(t, err, "a GitHub slot's grant, not a Gitea assignment's")
	_, _, err = NewGrant(full(), "drc1.tok", nil).GitHubConfig()
	assert.ErrorContains(t, err, "a Gitea assignment's grant, not a GitHub slot's")

	for _, tc := range []struct {
		name   string
		change func(*Grant)
		want   string
	}{
		{"no slot", func(g *Grant) { g.TaskID = 9 }, "no GitHub slot's id"},
		{"epoch zero", func(g *Grant) { g.Epoch = 0 }, "grant:"},
		{"relative runner", func(g *Grant) { g.GitHub.RunnerBin = "run.sh" }, "is not absolute"},
		{"short SHA-256", func(g *Grant) { g.GitHub.RunnerSHA256 = "abc" }, "not 64 hex digits"},
		{"no JIT configuration", func(g *Grant) { g.GitHub.JITConfig = " " }, "without its JIT configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGitHubGrant(want, "JIT")
			tc.change(&g)
			_, _, err := g.GitHubConfig()
			require.ErrorContains(t, err, tc.want)
		})
	}
}
