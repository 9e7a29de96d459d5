package launcher

import (
	"errors"
	"strings"
	"testing"
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
				if err != nil {
					t.Fatalf("ParseInstanceID(%q): %v", tt.in, err)
				}
				if got := id.String(); got != tt.in {
					t.Errorf("String() = %q, want %q", got, tt.in)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("ParseInstanceID(%q) = %v, %v; want ErrInvalidConfig", tt.in, id, err)
			}
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
				if err != nil || n.Reveal() != tt.in {
					t.Fatalf("ParseNonce(%q) = %q, %v", tt.in, n.Reveal(), err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("ParseNonce(%q) = %v; want ErrInvalidConfig", tt.in, err)
			}
			if tt.in != "" && strings.Contains(err.Error(), tt.in) {
				t.Errorf("the error %q shows the refused nonce", err)
			}
		})
	}
}

func TestNonceRedacted(t *testing.T) {
	n, err := ParseNonce("secretsecretsecret")
	if err != nil {
		t.Fatal(err)
	}
	if s := n.String(); strings.Contains(s, "secret") {
		t.Errorf("String() = %q shows the nonce", s)
	}
	cfg := DefaultConfig()
	cfg.Nonce = n
	if s := cfg.String(); strings.Contains(s, "secret") {
		t.Errorf("Config.String() = %q shows the nonce", s)
	}
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
				if err != nil || e.String() != tt.want {
					t.Fatalf("ParseEndpoint(%q) = %q, %v; want %q", tt.in, e, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("ParseEndpoint(%q) = %q, %v; want ErrInvalidConfig", tt.in, e, err)
			}
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
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		// Accepted ids are canonical: they round-trip and are safe as a path element.
		if got := id.String(); got != s {
			t.Fatalf("String() = %q, input %q", got, s)
		}
		if strings.ContainsAny(s, "/. \x00") || id.IsZero() {
			t.Fatalf("accepted %q", s)
		}
		if tap := TAPName(id); len(tap) > 15 || checkIfName("tap", tap) != nil {
			t.Fatalf("TAP name %q", tap)
		}
	})
}

func FuzzParseNonce(f *testing.F) {
	for _, s := range []string{"abcdefghijklmnop", "", "abcdefghijklmnop==", strings.Repeat("-", 128)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseNonce(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			if len(s) >= 4 && strings.Contains(err.Error(), s) {
				t.Fatalf("error %q shows the input", err)
			}
			return
		}
		if n.Reveal() != s || len(s) < MinNonceLen || len(s) > MaxNonceLen {
			t.Fatalf("accepted %q", s)
		}
		for i := 0; i < len(s); i++ {
			if !strings.ContainsRune("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", rune(s[i])) {
				t.Fatalf("accepted %q with %q", s, s[i])
			}
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
		if err != nil || again != e {
			t.Fatalf("%q -> %q -> %v, %v", s, e, again, err)
		}
		if strings.ContainsAny(e.String(), "@?#\"\\ ") {
			t.Fatalf("endpoint %q", e)
		}
	})
}
