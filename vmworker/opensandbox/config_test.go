package opensandbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
)

func assignmentTask(i int) assignment.TaskID { return assignment.TaskID(i) }

func TestNewRefuses(t *testing.T) {
	const key = "a-secret-key-value"
	nonces, _ := opensandbox.NewTestNonces(t)
	valid := func() opensandbox.Config {
		return opensandbox.Config{BaseURL: "https://opensandbox.example/v1", APIKey: []byte(key),
			Nonces: nonces, Endpoint: testEndpoint}
	}
	_, err := opensandbox.New(valid())
	require.NoError(t, err, "New(valid)")
	for _, tt := range []struct {
		name string
		mod  func(*opensandbox.Config)
	}{
		{"no URL", func(c *opensandbox.Config) { c.BaseURL = "" }},
		{"URL without scheme", func(c *opensandbox.Config) { c.BaseURL = "opensandbox.example" }},
		{"ftp URL", func(c *opensandbox.Config) { c.BaseURL = "ftp://opensandbox.example" }},
		{"URL with credentials", func(c *opensandbox.Config) { c.BaseURL = "https://user:" + key + "@opensandbox.example" }},
		{"URL with query", func(c *opensandbox.Config) { c.BaseURL = "https://opensandbox.example/v1?key=" + key }},
		{"no key", func(c *opensandbox.Config) { c.APIKey = nil }},
		{"blank key", func(c *opensandbox.Config) { c.APIKey = []byte(" \n") }},
		{"key with a space", func(c *opensandbox.Config) { c.APIKey = []byte(key + " " + key) }},
		{"key with a newline inside", func(c *opensandbox.Config) { c.APIKey = []byte(key + "\nX-Injected: 1") }},
		{"pool not a name", func(c *opensandbox.Config) { c.Pool = "CI_VM" }},
		{"scope not a label", func(c *opensandbox.Config) { c.Scope = "a/b" }},
		{"TTL below a minute", func(c *opensandbox.Config) { c.SandboxTTL = 30 * time.Second }},
		{"TTL above a day", func(c *opensandbox.Config) { c.SandboxTTL = 25 * time.Hour }},
		{"TTL not whole seconds", func(c *opensandbox.Config) { c.SandboxTTL = 90*time.Second + time.Millisecond }},
		{"no nonce issuer", func(c *opensandbox.Config) { c.Nonces = nil }},
		{"no endpoint", func(c *opensandbox.Config) { c.Endpoint = "" }},
		{"https endpoint", func(c *opensandbox.Config) { c.Endpoint = "https://10.0.0.1:7001" }},
		{"negative timeout", func(c *opensandbox.Config) { c.Timeout = -time.Second }},
		{"empty entrypoint element", func(c *opensandbox.Config) { c.Entrypoint = []string{"dynrunner", ""} }},
		{"empty resource value", func(c *opensandbox.Config) { c.Resources = map[string]string{"cpu": ""} }},
		{"image with white space", func(c *opensandbox.Config) { c.Image = " img " }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.mod(&cfg)
			_, err := opensandbox.New(cfg)
			require.ErrorIs(t, err, opensandbox.ErrInvalidConfig)
			assert.NotContains(t, err.Error(), key, "the error holds the API key")
			t.Logf("error: %v", err)
		})
	}
}
