package launcher

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseInstanceID(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{name: "canonical", in: "0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", ok: true},
		{name: "all f", in: "ffffffff-ffff-ffff-ffff-ffffffffffff", ok: true},
		{name: "uppercase", in: "0B5E7D3A-1C2D-4E5F-8A9B-0C1D2E3F4A5B"},
		{name: "mixed case", in: "0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4A5b"},
		{name: "braces", in: "{0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b}"},
		{name: "urn", in: "urn:uuid:0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"},
		{name: "no hyphens", in: "0b5e7d3a1c2d4e5f8a9b0c1d2e3f4a5b"},
		{name: "hyphen misplaced", in: "0b5e7d3a1-c2d-4e5f-8a9b-0c1d2e3f4a5b"},
		{name: "nil uuid", in: "00000000-0000-0000-0000-000000000000"},
		{name: "empty", in: ""},
		{name: "non hex", in: "0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5g"},
		{name: "traversal", in: "../../../../etc/passwd-aaaaaaaaaaaaa"},
		{name: "shell", in: "0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f;rm -"},
		{name: "trailing newline", in: "0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b\n"},
		{name: "space", in: " 0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := ParseInstanceID(tt.in)
			if tt.ok {
				require.NoError(t, err)
				assert.Equal(t, tt.in, id.String())
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig, "ParseInstanceID(%q) = %v", tt.in, id)
		})
	}
}

func TestParseNonce(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{name: "16 chars", in: "abcdefghijklmnop", ok: true},
		{name: "alphabet", in: "ABCxyz019-_ABCxyz019-_", ok: true},
		{name: "128 chars", in: strings.Repeat("a", 128), ok: true},
		{name: "15 chars", in: "abcdefghijklmno"},
		{name: "129 chars", in: strings.Repeat("a", 129)},
		{name: "std base64 plus", in: "abcdefghijklmnop+"},
		{name: "std base64 slash", in: "abcdefghijklmnop/"},
		{name: "padding", in: "abcdefghijklmnop=="},
		{name: "shell", in: "abcdefghijklmnop$(id)"},
		{name: "space", in: "abcdefgh ijklmnop"},
		{name: "newline", in: "abcdefghijklmnop\n"},
		{name: "quote", in: "abcdefghijklmnop\""},
		{name: "non ascii", in: "abcdefghijklmnopé"},
		{name: "empty", in: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := ParseNonce(tt.in)
			if tt.ok {
				require.NoError(t, err)
				assert.Equal(t, tt.in, n.Reveal())
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			if tt.in != "" {
				assert.NotContains(t, err.Error(), tt.in, "the error shows the refused nonce")
			}
		})
	}
}

func TestNonceRedacted(t *testing.T) {
	n, err := ParseNonce("secretsecretsecret")
	require.NoError(t, err)
	assert.NotContains(t, n.String(), "secret", "String() shows the nonce")
	cfg := DefaultConfig()
	cfg.Nonce = n
	assert.NotContains(t, cfg.String(), "secret", "Config.String() shows the nonce")
}

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{name: "ipv4", in: "http://10.213.0.1:8080", want: "http://10.213.0.1:8080"},
		{name: "trailing slash", in: "http://10.213.0.1:8080/", want: "http://10.213.0.1:8080"},
		{name: "ipv6", in: "http://[fd00::1]:80", want: "http://[fd00::1]:80"},
		{name: "https", in: "https://10.213.0.1:8080"},
		{name: "no port", in: "http://10.213.0.1"},
		{name: "port 0", in: "http://10.213.0.1:0"},
		{name: "port too big", in: "http://10.213.0.1:65536"},
		{name: "port leading zero", in: "http://10.213.0.1:080"},
		{name: "hostname", in: "http://localhost:8080"},
		{name: "userinfo", in: "http://u:p@10.213.0.1:8080"},
		{name: "query", in: "http://10.213.0.1:8080/?a=b"},
		{name: "empty query", in: "http://10.213.0.1:8080?"},
		{name: "fragment", in: "http://10.213.0.1:8080#x"},
		{name: "path", in: "http://10.213.0.1:8080/v1"},
		{name: "unspecified", in: "http://0.0.0.0:8080"},
		{name: "zone", in: "http://[fe80::1%25eth0]:8080"},
		{name: "empty", in: ""},
		{name: "shell", in: "http://10.213.0.1:8080;id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := ParseEndpoint(tt.in)
			if tt.want != "" {
				require.NoError(t, err)
				assert.Equal(t, tt.want, e.String())
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig, "ParseEndpoint(%q) = %q", tt.in, e)
		})
	}
}

func FuzzParseInstanceID(f *testing.F) {
	for _, s := range []string{"0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "", "00000000-0000-0000-0000-000000000000",
		"0B5E7D3A-1C2D-4E5F-8A9B-0C1D2E3F4A5B", "../../../../etc/passwd-aaaaaaaaaaaaa"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseInstanceID(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidConfig)
			return
		}
		// Accepted ids are canonical: they round-trip and are safe as a path element.
		require.Equal(t, s, id.String())
		require.False(t, strings.ContainsAny(s, "/. \x00") || id.IsZero(), "accepted %q", s)
		tap := TAPName(id)
		require.LessOrEqual(t, len(tap), 15, "TAP name %q", tap)
		require.NoError(t, checkIfName("tap", tap))
	})
}

func FuzzParseNonce(f *testing.F) {
	for _, s := range []string{"abcdefghijklmnop", "", "abcdefghijklmnop==", strings.Repeat("-", 128)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseNonce(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidConfig)
			if len(s) >= 4 {
				require.NotContains(t, err.Error(), s, "the error shows the input")
			}
			return
		}
		require.Equal(t, s, n.Reveal())
		require.GreaterOrEqual(t, len(s), MinNonceLen)
		require.LessOrEqual(t, len(s), MaxNonceLen)
		for i := 0; i < len(s); i++ {
			require.True(t, strings.ContainsRune("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", rune(s[i])), "accepted %q with %q", s, s[i])
		}
	})
}

func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"http://10.213.0.1:8080", "http://u@1.2.3.4:1/", "http://[::1]:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEndpoint(s)
		if err != nil {
			return
		}
		// What is accepted prints back as exactly http://<ip>:<port> and parses to itself.
		again, err := ParseEndpoint(e.String())
		require.NoError(t, err, "%q -> %q", s, e)
		require.Equal(t, e, again)
		require.False(t, strings.ContainsAny(e.String(), "@?#\"\\ "), "endpoint %q", e)
	})
}
