package githubtest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDecodeJITConfig feeds arbitrary strings to DecodeJITConfig. The property: it either
// refuses the input or what it decodes encodes and decodes again to the same configuration.
func FuzzDecodeJITConfig(f *testing.F) {
	enc, err := encodeJITConfig(JITConfig{AgentID: 3, AgentName: "slot-3", PoolID: 1, ServerURL: "http://127.0.0.1/tenant/",
		WorkFolder: "_work", Ephemeral: true, Credential: "runner_x"}, "http://127.0.0.1/tenant/_apis/oauth2/token")
	require.NoError(f, err)
	f.Add(enc)
	f.Add("")
	f.Add("e30=") // {}
	f.Add("not base64!")
	f.Fuzz(func(t *testing.T, in string) {
		cfg, err := DecodeJITConfig(in)
		if err != nil {
			return
		}
		again, err := encodeJITConfig(cfg, "")
		require.NoError(t, err)
		round, err := DecodeJITConfig(again)
		require.NoError(t, err)
		require.Equal(t, cfg, round)
	})
}
