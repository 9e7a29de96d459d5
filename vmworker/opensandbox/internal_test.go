package opensandbox

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		name, in string
		want     time.Duration
	}{
		{"empty", "", 0},
		{"seconds", "7", 7 * time.Second},
		{"spaces", " 2 ", 2 * time.Second},
		{"zero", "0", 0},
		{"negative", "-5", 0},
		{"junk", "soon", 0},
		{"date", now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{"past date", now.Add(-time.Hour).Format(http.TimeFormat), 0},
		{"huge", "99999999999999", (1 << 20) * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, parseRetryAfter(tt.in, now), "parseRetryAfter(%q)", tt.in)
		})
	}
}

func TestSanitize(t *testing.T) {
	key := []byte("0123456789abcdefghij")
	for _, tt := range []struct{ name, in string }{
		{"whole key", "bad key 0123456789abcdefghij here"},
		{"key at the cut", strings.Repeat("x", maxServerText-10) + "0123456789abcdefghij"},
		{"control characters", "line\none\x00\x1b[31m 0123456789abcdefghij"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := sanitize(tt.in, key)
			assert.NotContains(t, got, "0123456789", "sanitize(%q): holds (part of) the key", tt.in)
			assert.False(t, strings.ContainsAny(got, "\n\x00\x1b"), "sanitize(%q) = %q: holds control characters", tt.in, got)
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"", "1", "120", "-1", "Wed, 21 Oct 2015 07:28:00 GMT", "1.5", "9999999999999999999999"} {
		f.Add(s)
	}
	now := time.Now()
	f.Fuzz(func(t *testing.T, s string) {
		d := parseRetryAfter(s, now)
		assert.GreaterOrEqual(t, d, time.Duration(0), "parseRetryAfter(%q)", s)
		assert.LessOrEqual(t, d, (1<<20)*time.Second, "parseRetryAfter(%q)", s)
	})
}

// FuzzAnswers feeds arbitrary answers to the decoders of get and list: they must not panic,
// and their errors must never hold the key.
func FuzzAnswers(f *testing.F) {
	for _, s := range []string{
		`{"id":"sb-1","status":{"state":"Running"},"metadata":{"dynrunner.io/managed-by":"dynrunner"}}`,
		`{"items":[{"id":"sb-1","status":{"state":"Pending"}}],"pagination":{"page":1,"pageSize":100,"totalItems":1,"totalPages":1,"hasNextPage":false}}`,
		`{"items":[],"pagination":{"hasNextPage":true}}`,
		`{"code":"X","message":"the-fuzz-key-1234567890"}`,
		`null`, `[]`, `{"id": "trunc`, "\x00\xff",
	} {
		f.Add(s, 200)
		f.Add(s, 500)
	}
	var body atomic.Value
	var status atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(body.Load().(string)))
	}))
	defer srv.Close()
	const key = "the-fuzz-key-1234567890"
	nonces, _ := NewTestNonces(f)
	b, err := New(Config{BaseURL: srv.URL, APIKey: []byte(key), Nonces: nonces, Endpoint: "http://10.0.0.1:7001",
		Retries: -1, Timeout: time.Second, Log: zerolog.Nop()})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, answer string, code int) {
		if code < 200 || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
			code = 200
		}
		body.Store(answer)
		status.Store(int64(code))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, gerr := b.get(ctx, "sb-1")
		_, lerr := b.list(ctx, nil)
		for _, err := range []error{gerr, lerr} {
			if err == nil {
				continue
			}
			assert.NotContains(t, err.Error(), key, "the error holds the key")
			if utf8.ValidString(answer) {
				assert.True(t, utf8.ValidString(err.Error()), "error is not valid UTF-8: %q", err)
			}
		}
	})
}
