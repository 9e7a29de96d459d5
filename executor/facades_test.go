package executor

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFacadeURLs(t *testing.T) {
	many := make([]string, MaxFacades+1)
	for i := range many {
		many[i] = fmt.Sprintf("https://f%d:8443", i)
	}
	for _, tc := range []struct {
		name string
		in   string
		want []string // nil: refused
	}{
		{"one", "https://facade:8443", []string{"https://facade:8443"}},
		{"trailing slash dropped", "https://facade:8443/", []string{"https://facade:8443"}},
		{"no port", "https://facade", []string{"https://facade"}},
		{"several in order", "https://b:1,https://a:2", []string{"https://b:1", "https://a:2"}},
		{"spaces around entries", " https://a:1 , https://b:2 ", []string{"https://a:1", "https://b:2"}},
		{"duplicates dropped", "https://a:1,https://b:2,https://A:1/", []string{"https://a:1", "https://b:2"}},
		{"default port is a duplicate", "https://a,https://a:443", []string{"https://a"}},
		{"ipv6", "https://[::1]:8443", []string{"https://[::1]:8443"}},
		{"sixteen", strings.Join(many[:MaxFacades], ","), many[:MaxFacades]},
		{"seventeen", strings.Join(many, ","), nil},
		{"empty", "", nil},
		{"blank", "  ", nil},
		{"empty entry", "https://a:1,,https://b:2", nil},
		{"trailing comma", "https://a:1,", nil},
		{"plain http", "http://a:1", nil},
		{"plain http among https", "https://a:1,http://b:1", nil},
		{"no host", "https://", nil},
		{"no scheme", "facade:8443", nil},
		{"a path", "https://a:1/facade", nil},
		{"a query", "https://a:1?x=1", nil},
		{"user info", "https://u:p@a:1", nil},
		{"not a url", "https://a:1:2:3\x7f", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseFacadeURLs(tc.in)
			if tc.want == nil {
				require.ErrorIs(t, err, ErrFacadeURL)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// FuzzParseFacadeURLs: what ParseFacadeURLs accepts is a list of at most MaxFacades distinct
// https URLs without path, which parses again to itself.
func FuzzParseFacadeURLs(f *testing.F) {
	for _, s := range []string{"https://a:1", "https://a:1,https://b:2", "https://a:1,https://a:1", "http://a", "https://a/p", ",", "https://[::1]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseFacadeURLs(s)
		if err != nil {
			require.ErrorIs(t, err, ErrFacadeURL)
			return
		}
		require.NotEmpty(t, got)
		require.LessOrEqual(t, len(got), MaxFacades)
		seen := map[string]bool{}
		for _, g := range got {
			u, err := url.Parse(g)
			require.NoError(t, err)
			require.Equal(t, "https", u.Scheme)
			require.NotEmpty(t, u.Hostname())
			require.Empty(t, u.Path)
			key := strings.ToLower(hostPort(u))
			require.False(t, seen[key], "duplicate %s", g)
			seen[key] = true
		}
		again, err := ParseFacadeURLs(strings.Join(got, ","))
		require.NoError(t, err)
		require.Equal(t, got, again)
	})
}
