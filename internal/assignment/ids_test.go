package assignment

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseForgeURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://gitea.example.com/", "https://gitea.example.com"},
		{"http://10.0.0.2:3000", "http://10.0.0.2:3000"},
		{"https://example.com/gitea/", "https://example.com/gitea"},
		{"http://[2001:db8::1]:3000/", "http://[2001:db8::1]:3000"},
	} {
		got, err := ParseForgeURL(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got.String())
	}
	for _, bad := range []string{
		"", "gitea.example.com", "ftp://gitea.example.com", "https://", "https://:3000",
		"https://user:pass@gitea.example.com", "https://gitea.example.com/?x=1", "https://gitea.example.com/#f",
		"https://gitea.example.com/a b", "javascript:alert(1)", "https://gitea.example.com\n/x",
	} {
		_, err := ParseForgeURL(bad)
		assert.ErrorIs(t, err, ErrInvalidID, "%q", bad)
	}
}

// FuzzParseForgeURL: whatever the forge puts in a task's server_url, an accepted URL is an
// absolute http(s) URL with a host and without credentials, query or fragment, and parsing it
// again gives it back.
func FuzzParseForgeURL(f *testing.F) {
	for _, s := range []string{"https://gitea.example.com/", "http://10.0.0.2:3000", "https://u:p@h/", "http://h/p?q#f", "http://h:99999/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseForgeURL(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidID, "error %v is not ErrInvalidID", err)
			return
		}
		u, perr := url.Parse(got.String())
		require.NoError(t, perr, "accepted %q as %q", s, got)
		require.Contains(t, []string{"http", "https"}, u.Scheme, "accepted %q as %q: scheme", s, got)
		require.NotEmpty(t, u.Hostname(), "accepted %q as %q: no host", s, got)
		require.Nil(t, u.User, "accepted %q as %q: credentials", s, got)
		require.Empty(t, u.RawQuery, "accepted %q as %q: query", s, got)
		require.Empty(t, u.Fragment, "accepted %q as %q: fragment", s, got)
		require.False(t, strings.HasSuffix(got.String(), "/"), "accepted %q as %q: trailing slash", s, got)
		require.False(t, strings.ContainsAny(got.String(), " \t\r\n"), "accepted %q as %q: white space", s, got)
		again, err := ParseForgeURL(got.String())
		require.NoError(t, err, "%q parses to %q, which parses to %q (%v)", s, got, again, err)
		require.Equal(t, got, again, "%q parses to %q, which parses to %q (%v)", s, got, again, err)
	})
}

// FuzzParseIDs: task ids and epochs parse only in canonical form (a positive decimal without
// sign or leading zero), so what parses prints back exactly; everything else is ErrInvalidID.
func FuzzParseIDs(f *testing.F) {
	for _, s := range []string{"1", "42", "0", "-1", "+1", "01", "9223372036854775807", "18446744073709551615", "1e3", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if task, err := ParseTaskID(s); err == nil {
			assert.Positive(t, int64(task))
			assert.Equal(t, s, task.String())
		} else {
			require.ErrorIs(t, err, ErrInvalidID)
			assert.Zero(t, task)
		}
		if epoch, err := ParseEpoch(s); err == nil {
			assert.NotZero(t, uint64(epoch))
			assert.Equal(t, s, epoch.String())
		} else {
			require.ErrorIs(t, err, ErrInvalidID)
			assert.Zero(t, epoch)
		}
	})
}
