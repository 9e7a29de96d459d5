package standin_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest/standin"
)

// FuzzDecodeJITConfig feeds arbitrary strings to DecodeJITConfig. The property: it either
// refuses the input with ErrJITConfig or what it decodes encodes and decodes again to the same
// configuration.
func FuzzDecodeJITConfig(f *testing.F) {
	enc, err := standin.EncodeJITConfig(standin.JITConfig{AgentID: 3, AgentName: "slot-3", PoolID: 1, ServerURL: "http://127.0.0.1/tenant/",
		WorkFolder: "_work", Ephemeral: true, Credential: "runner_x"}, "http://127.0.0.1/tenant/_apis/oauth2/token")
	require.NoError(f, err)
	f.Add(enc)
	f.Add("")
	f.Add("e30=") // {}
	f.Add("not base64!")
	f.Fuzz(func(t *testing.T, in string) {
		cfg, err := standin.DecodeJITConfig(in)
		if err != nil {
			require.ErrorIs(t, err, standin.ErrJITConfig)
			return
		}
		again, err := standin.EncodeJITConfig(cfg, "")
		require.NoError(t, err)
		round, err := standin.DecodeJITConfig(again)
		require.NoError(t, err)
		require.Equal(t, cfg, round)
	})
}

func TestDecodeJITConfigRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"not base64", "not base64!"},
		{"not an object", "WzFd"}, // [1]
		{"no files", "e30="},      // {}
		{"file not base64", "eyIucnVubmVyIjoiISIsIi5jcmVkZW50aWFscyI6ImUzMD0ifQ=="}, // {".runner":"!",".credentials":"e30="}
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := standin.DecodeJITConfig(tc.in)
			require.ErrorIs(t, err, standin.ErrJITConfig)
		})
	}
}

func TestValidate(t *testing.T) {
	good := standin.JITConfig{AgentID: 1, ServerURL: "https://127.0.0.1:8443/tenant/", Credential: "runner_x"}
	require.NoError(t, standin.Validate(good))
	for _, tc := range []struct {
		name string
		mod  func(*standin.JITConfig)
	}{
		{"no agent id", func(c *standin.JITConfig) { c.AgentID = 0 }},
		{"no credential", func(c *standin.JITConfig) { c.Credential = "" }},
		{"no server", func(c *standin.JITConfig) { c.ServerURL = "" }},
		{"not http", func(c *standin.JITConfig) { c.ServerURL = "file:///etc/passwd" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mod(&cfg)
			require.ErrorIs(t, standin.Validate(cfg), standin.ErrJITConfig)
		})
	}
}
