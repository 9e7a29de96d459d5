package captoken

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// testExpires is the expiry of the tokens the tests issue: 2026-12-05T23:00:00Z.
var testExpires = time.Date(2026, 12, 5, 23, 0, 0, 0, time.UTC)

func mustIssuer(t testing.TB, key []byte) *Issuer {
	t.Helper()
	i, err := NewIssuer(key)
	require.NoError(t, err, "NewIssuer()")
	return i
}

func mustIssue(t testing.TB, i *Issuer, task assignment.TaskID, epoch assignment.Epoch, p Purpose) Token {
	t.Helper()
	tok, err := i.Issue(task, epoch, p, testExpires)
	require.NoError(t, err, "Issue()")
	return tok
}

func TestNewIssuer(t *testing.T) {
	tests := []struct {
		name    string
		key     []byte
		wantErr error
	}{
		{name: "32 bytes", key: testKey},
		{name: "longer", key: bytes.Repeat([]byte("k"), 64)},
		{name: "31 bytes", key: testKey[:31], wantErr: ErrShortKey},
		{name: "empty", key: nil, wantErr: ErrShortKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewIssuer(tt.key)
			require.ErrorIs(t, err, tt.wantErr, "NewIssuer()")
			if err != nil && len(tt.key) > 0 {
				assert.NotContains(t, err.Error(), string(tt.key), "the error echoes the key")
			}
		})
	}
}

func TestIssuerCopiesKey(t *testing.T) {
	key := bytes.Clone(testKey)
	i := mustIssuer(t, key)
	tok := mustIssue(t, i, 1, 1, PurposeRegister)
	clear(key)
	_, err := i.Verify(tok.Secret())
	require.NoError(t, err, "Verify() after the caller cleared its key")
}

func TestIssueVerify(t *testing.T) {
	i := mustIssuer(t, testKey)
	tests := []struct {
		name    string
		task    assignment.TaskID
		epoch   assignment.Epoch
		purpose Purpose
		expires time.Time
		// want is the expiry the token carries (zero: expires).
		want time.Time
	}{
		{name: "register", task: 42, epoch: 7, purpose: PurposeRegister, expires: testExpires},
		{name: "nonce", task: 1, epoch: 1, purpose: PurposeNonce, expires: testExpires},
		{name: "largest ids and expiry", task: math.MaxInt64, epoch: math.MaxUint64, purpose: PurposeRegister,
			expires: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), want: time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)},
		{name: "earliest expiry", task: 1, epoch: 1, purpose: PurposeRegister, expires: time.Unix(1, 0)},
		{name: "expiry truncated to the second", task: 1, epoch: 1, purpose: PurposeRegister,
			expires: testExpires.Add(999 * time.Millisecond), want: testExpires},
		{name: "expiry in another zone", task: 1, epoch: 1, purpose: PurposeRegister,
			expires: testExpires.In(time.FixedZone("CET", 3600)), want: testExpires},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want.IsZero() {
				want = tt.expires.UTC()
			}
			tok, err := i.Issue(tt.task, tt.epoch, tt.purpose, tt.expires)
			require.NoError(t, err, "Issue()")
			assert.Equal(t, want, tok.Expires(), "Issue(): expires")
			wire := tok.Secret()
			assert.LessOrEqual(t, len(wire), maxWireLen, "wire form bytes, more than maxWireLen")
			assert.Empty(t, strings.Trim(wire, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."), "wire form %q is not URL-safe", wire)
			wantPrefix := fmt.Sprintf("drc2.%d.%d.%s.%d.", tt.task, tt.epoch, tt.purpose, want.Unix())
			assert.True(t, strings.HasPrefix(wire, wantPrefix), "wire form %q does not start with %q", wire, wantPrefix)
			got, err := i.Verify(wire)
			require.NoError(t, err, "Verify()")
			assert.Equal(t, tt.task, got.Task(), "Verify(): task")
			assert.Equal(t, tt.epoch, got.Epoch(), "Verify(): epoch")
			assert.Equal(t, tt.purpose, got.Purpose(), "Verify(): purpose")
			assert.Equal(t, want, got.Expires(), "Verify(): expires")
			assert.Equal(t, tok.ID(), got.ID(), "ID()")
			assert.Equal(t, wire, got.Secret(), "Secret()")
			// Verifying again succeeds: single use is the caller's job.
			_, err = i.Verify(wire)
			assert.NoError(t, err, "second Verify()")
		})
	}
}

func TestIssueFresh(t *testing.T) {
	i := mustIssuer(t, testKey)
	seen := map[string]bool{}
	for range 100 {
		tok := mustIssue(t, i, 42, 7, PurposeRegister)
		require.False(t, seen[tok.ID()], "ID %s issued twice", tok.ID())
		seen[tok.ID()] = true
		assert.Len(t, tok.ID(), 32, "ID(), want 32 hex characters")
	}
}

func TestIssueErrors(t *testing.T) {
	i := mustIssuer(t, testKey)
	tests := []struct {
		name    string
		task    assignment.TaskID
		epoch   assignment.Epoch
		purpose Purpose
		expires time.Time
		wantErr error
	}{
		{name: "zero task", task: 0, epoch: 1, purpose: PurposeRegister, expires: testExpires, wantErr: assignment.ErrInvalidID},
		{name: "negative task", task: -1, epoch: 1, purpose: PurposeRegister, expires: testExpires, wantErr: assignment.ErrInvalidID},
		{name: "zero epoch", task: 1, epoch: 0, purpose: PurposeRegister, expires: testExpires, wantErr: assignment.ErrInvalidID},
		{name: "unknown purpose", task: 1, epoch: 1, purpose: "admin", expires: testExpires, wantErr: ErrUnknownPurpose},
		{name: "empty purpose", task: 1, epoch: 1, purpose: "", expires: testExpires, wantErr: ErrUnknownPurpose},
		{name: "purpose with a dot", task: 1, epoch: 1, purpose: "register.x", expires: testExpires, wantErr: ErrUnknownPurpose},
		{name: "zero expiry", task: 1, epoch: 1, purpose: PurposeRegister, wantErr: ErrInvalidExpiry},
		{name: "expiry at the Unix epoch", task: 1, epoch: 1, purpose: PurposeRegister, expires: time.Unix(0, 0), wantErr: ErrInvalidExpiry},
		{name: "expiry before the Unix epoch", task: 1, epoch: 1, purpose: PurposeRegister, expires: time.Unix(-1, 0), wantErr: ErrInvalidExpiry},
		{name: "expiry after year 9999", task: 1, epoch: 1, purpose: PurposeRegister, expires: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), wantErr: ErrInvalidExpiry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := i.Issue(tt.task, tt.epoch, tt.purpose, tt.expires)
			require.ErrorIs(t, err, tt.wantErr, "Issue()")
		})
	}
}

func TestParsePurpose(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Purpose
		wantErr error
	}{
		{name: "register", in: "register", want: PurposeRegister},
		{name: "nonce", in: "nonce", want: PurposeNonce},
		{name: "upper case", in: "REGISTER", wantErr: ErrUnknownPurpose},
		{name: "empty", in: "", wantErr: ErrUnknownPurpose},
		{name: "padded", in: " nonce", wantErr: ErrUnknownPurpose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePurpose(tt.in)
			require.ErrorIs(t, err, tt.wantErr, "ParsePurpose()")
			assert.Equal(t, tt.want, got, "ParsePurpose()")
		})
	}
}

func TestVerifyErrors(t *testing.T) {
	i := mustIssuer(t, testKey)
	tok := mustIssue(t, i, 42, 7, PurposeRegister)
	wire := tok.Secret()
	parts := strings.Split(wire, ".")
	require.Len(t, parts, 7, "wire form %q", wire)
	const (
		version = iota
		task
		epoch
		purpose
		expires
		nonce
		mac
	)
	require.Equal(t, "1796511600", parts[expires], "the expiry field of %q", wire)
	// with returns the wire form with field i replaced by v.
	with := func(i int, v string) string {
		p := slices.Clone(parts)
		p[i] = v
		return strings.Join(p, ".")
	}
	other := mustIssue(t, mustIssuer(t, bytes.Repeat([]byte("o"), 32)), 42, 7, PurposeRegister)
	flipLast := func(s string) string {
		c := byte('A')
		if s[len(s)-1] == 'A' {
			c = 'Q'
		}
		return s[:len(s)-1] + string(c)
	}
	// drc1 is the first version's wire form, without an expiry: its fields, MAC included,
	// are well formed.
	drc1 := strings.Join([]string{"drc1", parts[task], parts[epoch], parts[purpose], parts[nonce], parts[mac]}, ".")

	tests := []struct {
		name    string
		wire    string
		wantErr error
	}{
		{name: "empty", wire: "", wantErr: ErrMalformed},
		{name: "garbage", wire: "not a token", wantErr: ErrMalformed},
		{name: "too long", wire: wire + strings.Repeat("A", maxWireLen), wantErr: ErrMalformed},
		{name: "unknown version", wire: with(version, "drc3"), wantErr: ErrMalformed},
		{name: "first version", wire: drc1, wantErr: ErrMalformed},
		{name: "first version with an expiry", wire: with(version, "drc1"), wantErr: ErrMalformed},
		{name: "missing field", wire: strings.Join(parts[:6], "."), wantErr: ErrMalformed},
		{name: "missing expiry", wire: strings.Join(slices.Delete(slices.Clone(parts), expires, expires+1), "."), wantErr: ErrMalformed},
		{name: "extra field", wire: wire + ".x", wantErr: ErrMalformed},
		{name: "trailing newline", wire: wire + "\n", wantErr: ErrMalformed},
		{name: "task with leading zero", wire: with(task, "042"), wantErr: ErrMalformed},
		{name: "task with sign", wire: with(task, "+42"), wantErr: ErrMalformed},
		{name: "zero task", wire: with(task, "0"), wantErr: ErrMalformed},
		{name: "zero epoch", wire: with(epoch, "0"), wantErr: ErrMalformed},
		{name: "unknown purpose", wire: with(purpose, "admin"), wantErr: ErrMalformed},
		{name: "empty expiry", wire: with(expires, ""), wantErr: ErrMalformed},
		{name: "expiry with leading zero", wire: with(expires, "0"+parts[expires]), wantErr: ErrMalformed},
		{name: "expiry with plus sign", wire: with(expires, "+"+parts[expires]), wantErr: ErrMalformed},
		{name: "expiry with minus sign", wire: with(expires, "-"+parts[expires]), wantErr: ErrMalformed},
		{name: "zero expiry", wire: with(expires, "0"), wantErr: ErrMalformed},
		{name: "expiry in RFC 3339", wire: with(expires, "2026-12-05T23:00:00Z"), wantErr: ErrMalformed},
		{name: "expiry in exponent form", wire: with(expires, "17965116e2"), wantErr: ErrMalformed},
		{name: "expiry with underscore", wire: with(expires, "1_796_511_600"), wantErr: ErrMalformed},
		{name: "expiry after year 9999", wire: with(expires, "253402300800"), wantErr: ErrMalformed},
		{name: "expiry beyond int64", wire: with(expires, "99999999999999999999"), wantErr: ErrMalformed},
		{name: "padded nonce", wire: with(nonce, parts[nonce]+"=="), wantErr: ErrMalformed},
		{name: "short nonce", wire: with(nonce, parts[nonce][1:]), wantErr: ErrMalformed},
		{name: "nonce in std alphabet", wire: with(nonce, "+/"+parts[nonce][2:]), wantErr: ErrMalformed},
		{name: "short mac", wire: with(mac, parts[mac][1:]), wantErr: ErrMalformed},
		{name: "non-canonical mac bits", wire: with(mac, parts[mac][:42]+"B"), wantErr: ErrMalformed},
		{name: "other task", wire: with(task, "43"), wantErr: ErrBadMAC},
		{name: "other epoch", wire: with(epoch, "8"), wantErr: ErrBadMAC},
		{name: "other purpose", wire: with(purpose, string(PurposeNonce)), wantErr: ErrBadMAC},
		{name: "later expiry", wire: with(expires, "1796511601"), wantErr: ErrBadMAC},
		{name: "much later expiry", wire: with(expires, "253402300799"), wantErr: ErrBadMAC},
		{name: "earlier expiry", wire: with(expires, "1796511599"), wantErr: ErrBadMAC},
		{name: "other nonce", wire: with(nonce, flipLast(parts[nonce])), wantErr: ErrBadMAC},
		{name: "altered mac", wire: with(mac, "A"+parts[mac][1:]), wantErr: ErrBadMAC},
		{name: "zero mac", wire: with(mac, base64.RawURLEncoding.EncodeToString(make([]byte, 32))), wantErr: ErrBadMAC},
		{name: "issued with another key", wire: other.Secret(), wantErr: ErrBadMAC},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NotEqual(t, wire, tt.wire, "test case does not alter the token")
			got, err := i.Verify(tt.wire)
			require.ErrorIs(t, err, tt.wantErr, "Verify()")
			assert.Zero(t, got, "Verify() returned a non-zero token with an error")
			for _, secret := range []string{parts[nonce], parts[mac], tt.wire} {
				if secret != "" {
					assert.NotContains(t, err.Error(), secret, "the error contains the token or a part of it")
				}
			}
		})
	}
	t.Run("first version names the version", func(t *testing.T) {
		_, err := i.Verify(drc1)
		require.ErrorContains(t, err, "unknown version", "Verify() of a drc1 token")
	})
}

func TestExpired(t *testing.T) {
	tok := mustIssue(t, mustIssuer(t, testKey), 42, 7, PurposeRegister)
	tests := []struct {
		name string
		now  time.Time
		want bool
	}{
		{name: "long before", now: testExpires.Add(-time.Hour), want: false},
		{name: "a second before", now: testExpires.Add(-time.Second), want: false},
		{name: "at the expiry", now: testExpires, want: false},
		{name: "a nanosecond after", now: testExpires.Add(time.Nanosecond), want: true},
		{name: "long after", now: testExpires.Add(time.Hour), want: true},
		{name: "after, in another zone", now: testExpires.Add(time.Second).In(time.FixedZone("CET", 3600)), want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tok.Expired(tt.now), "Expired(%s)", tt.now)
		})
	}
}

func TestTokenRedaction(t *testing.T) {
	i := mustIssuer(t, testKey)
	tok := mustIssue(t, i, 42, 7, PurposeRegister)
	secret := tok.Secret()
	parts := strings.Split(secret, ".")
	want := "drc2.42.7.register.2026-12-05T23:00:00Z." + tok.ID() + ".REDACTED"
	assert.Equal(t, want, tok.String(), "String() = %q, want %q", tok.String(), want)

	var logBuf bytes.Buffer
	slog.New(slog.NewJSONHandler(&logBuf, nil)).Info("issued", "token", tok)
	slog.New(slog.NewTextHandler(&logBuf, nil)).Info("issued", "token", tok)
	jsonBytes, err := json.Marshal(tok)
	require.NoError(t, err)
	outputs := map[string]string{
		"slog":         logBuf.String(),
		"json.Marshal": string(jsonBytes),
		"struct %+v":   fmt.Sprintf("%+v", struct{ T Token }{tok}),
		"pointer %v":   fmt.Sprintf("%v", &tok),
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
		outputs[verb] = fmt.Sprintf(verb, tok)
	}
	for name, out := range outputs {
		for _, s := range []string{secret, parts[5], parts[6]} {
			assert.NotContains(t, out, s, "%s output leaks the secret", name)
		}
	}
	assert.Equal(t, `"`+want+`"`, string(jsonBytes), "json.Marshal()")
	assert.Equal(t, want, fmt.Sprintf("%v", tok), "%%v = %q, want %q", fmt.Sprintf("%v", tok), want)
}

func FuzzVerify(f *testing.F) {
	i := mustIssuer(f, testKey)
	tok := mustIssue(f, i, 42, 7, PurposeRegister)
	f.Add(tok.Secret())
	longest, err := i.Issue(math.MaxInt64, math.MaxUint64, PurposeNonce, time.Unix(maxExpires, 0))
	require.NoError(f, err, "Issue()")
	f.Add(longest.Secret())
	f.Add("drc2.1.1.register.1.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("drc2.1.1.register.01796511600.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("drc2.1.1.register.-1.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("drc1.1.1.register.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("drc2......")
	f.Add("drc1.....")
	f.Add("")
	f.Fuzz(func(t *testing.T, wire string) {
		got, err := i.Verify(wire)
		if err != nil {
			require.True(t, errors.Is(err, ErrMalformed) || errors.Is(err, ErrBadMAC), "Verify() error = %v, want ErrMalformed or ErrBadMAC", err)
			if len(wire) > 8 {
				require.NotContains(t, err.Error(), wire, "the error echoes the input")
			}
			return
		}
		// Only the canonical form verifies, so it round-trips exactly.
		require.Equal(t, wire, got.Secret(), "Verify(")
		require.Positive(t, got.Task(), "Verify(%q) returned an invalid task", wire)
		require.NotZero(t, got.Epoch(), "Verify(%q) returned an invalid epoch", wire)
		_, err = ParsePurpose(string(got.Purpose()))
		require.NoError(t, err, "Verify(%q) returned purpose %q", wire, got.Purpose())
		require.True(t, got.Expires().Unix() > 0 && got.Expires().Unix() <= maxExpires,
			"Verify(%q) returned expiry %s", wire, got.Expires())
		require.LessOrEqual(t, len(wire), maxWireLen, "Verify() accepted more than maxWireLen bytes")
	})
}
