package captoken

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func mustIssuer(t testing.TB, key []byte) *Issuer {
	t.Helper()
	i, err := NewIssuer(key)
	require.NoError(t, err, "NewIssuer()")
	return i
}

func mustIssue(t testing.TB, i *Issuer, task assignment.TaskID, epoch assignment.Epoch, p Purpose) Token {
	t.Helper()
	tok, err := i.Issue(task, epoch, p)
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
	}{
		{name: "register", task: 42, epoch: 7, purpose: PurposeRegister},
		{name: "nonce", task: 1, epoch: 1, purpose: PurposeNonce},
		{name: "largest ids", task: math.MaxInt64, epoch: math.MaxUint64, purpose: PurposeRegister},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := mustIssue(t, i, tt.task, tt.epoch, tt.purpose)
			wire := tok.Secret()
			assert.LessOrEqual(t, len(wire), maxWireLen, "wire form bytes, more than maxWireLen")
			assert.Empty(t, strings.Trim(wire, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."), "wire form %q is not URL-safe", wire)
			wantPrefix := fmt.Sprintf("drc1.%d.%d.%s.", tt.task, tt.epoch, tt.purpose)
			assert.True(t, strings.HasPrefix(wire, wantPrefix), "wire form %q does not start with %q", wire, wantPrefix)
			got, err := i.Verify(wire)
			require.NoError(t, err, "Verify()")
			assert.Equal(t, tt.task, got.Task(), "Verify(): task")
			assert.Equal(t, tt.epoch, got.Epoch(), "Verify(): epoch")
			assert.Equal(t, tt.purpose, got.Purpose(), "Verify(): purpose")
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
		wantErr error
	}{
		{name: "zero task", task: 0, epoch: 1, purpose: PurposeRegister, wantErr: assignment.ErrInvalidID},
		{name: "negative task", task: -1, epoch: 1, purpose: PurposeRegister, wantErr: assignment.ErrInvalidID},
		{name: "zero epoch", task: 1, epoch: 0, purpose: PurposeRegister, wantErr: assignment.ErrInvalidID},
		{name: "unknown purpose", task: 1, epoch: 1, purpose: "admin", wantErr: ErrUnknownPurpose},
		{name: "empty purpose", task: 1, epoch: 1, purpose: "", wantErr: ErrUnknownPurpose},
		{name: "purpose with a dot", task: 1, epoch: 1, purpose: "register.x", wantErr: ErrUnknownPurpose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := i.Issue(tt.task, tt.epoch, tt.purpose)
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
	join := func(p ...string) string { return strings.Join(p, ".") }
	other := mustIssue(t, mustIssuer(t, bytes.Repeat([]byte("o"), 32)), 42, 7, PurposeRegister)
	flipLast := func(s string) string {
		c := byte('A')
		if s[len(s)-1] == 'A' {
			c = 'Q'
		}
		return s[:len(s)-1] + string(c)
	}

	tests := []struct {
		name    string
		wire    string
		wantErr error
	}{
		{name: "empty", wire: "", wantErr: ErrMalformed},
		{name: "garbage", wire: "not a token", wantErr: ErrMalformed},
		{name: "too long", wire: wire + strings.Repeat("A", maxWireLen), wantErr: ErrMalformed},
		{name: "unknown version", wire: join("drc2", parts[1], parts[2], parts[3], parts[4], parts[5]), wantErr: ErrMalformed},
		{name: "missing field", wire: join(parts[:5]...), wantErr: ErrMalformed},
		{name: "extra field", wire: wire + ".x", wantErr: ErrMalformed},
		{name: "trailing newline", wire: wire + "\n", wantErr: ErrMalformed},
		{name: "task with leading zero", wire: join(parts[0], "042", parts[2], parts[3], parts[4], parts[5]), wantErr: ErrMalformed},
		{name: "task with sign", wire: join(parts[0], "+42", parts[2], parts[3], parts[4], parts[5]), wantErr: ErrMalformed},
		{name: "zero task", wire: join(parts[0], "0", parts[2], parts[3], parts[4], parts[5]), wantErr: ErrMalformed},
		{name: "zero epoch", wire: join(parts[0], parts[1], "0", parts[3], parts[4], parts[5]), wantErr: ErrMalformed},
		{name: "unknown purpose", wire: join(parts[0], parts[1], parts[2], "admin", parts[4], parts[5]), wantErr: ErrMalformed},
		{name: "padded nonce", wire: join(parts[0], parts[1], parts[2], parts[3], parts[4]+"==", parts[5]), wantErr: ErrMalformed},
		{name: "short nonce", wire: join(parts[0], parts[1], parts[2], parts[3], parts[4][1:], parts[5]), wantErr: ErrMalformed},
		{name: "nonce in std alphabet", wire: join(parts[0], parts[1], parts[2], parts[3], "+/"+parts[4][2:], parts[5]), wantErr: ErrMalformed},
		{name: "short mac", wire: join(parts[0], parts[1], parts[2], parts[3], parts[4], parts[5][1:]), wantErr: ErrMalformed},
		{name: "non-canonical mac bits", wire: join(parts[0], parts[1], parts[2], parts[3], parts[4], parts[5][:42]+"B"), wantErr: ErrMalformed},
		{name: "other task", wire: join(parts[0], "43", parts[2], parts[3], parts[4], parts[5]), wantErr: ErrBadMAC},
		{name: "other epoch", wire: join(parts[0], parts[1], "8", parts[3], parts[4], parts[5]), wantErr: ErrBadMAC},
		{name: "other purpose", wire: join(parts[0], parts[1], parts[2], string(PurposeNonce), parts[4], parts[5]), wantErr: ErrBadMAC},
		{name: "other nonce", wire: join(parts[0], parts[1], parts[2], parts[3], flipLast(parts[4]), parts[5]), wantErr: ErrBadMAC},
		{name: "altered mac", wire: join(parts[0], parts[1], parts[2], parts[3], parts[4], "A"+parts[5][1:]), wantErr: ErrBadMAC},
		{name: "zero mac", wire: join(parts[0], parts[1], parts[2], parts[3], parts[4], base64.RawURLEncoding.EncodeToString(make([]byte, 32))), wantErr: ErrBadMAC},
		{name: "issued with another key", wire: other.Secret(), wantErr: ErrBadMAC},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NotEqual(t, wire, tt.wire, "test case does not alter the token")
			got, err := i.Verify(tt.wire)
			require.ErrorIs(t, err, tt.wantErr, "Verify()")
			assert.Zero(t, got, "Verify() returned a non-zero token with an error")
			for _, secret := range []string{parts[4], parts[5], tt.wire} {
				if secret != "" {
					assert.NotContains(t, err.Error(), secret, "the error contains the token or a part of it")
				}
			}
		})
	}
}

func TestTokenRedaction(t *testing.T) {
	i := mustIssuer(t, testKey)
	tok := mustIssue(t, i, 42, 7, PurposeRegister)
	secret := tok.Secret()
	parts := strings.Split(secret, ".")
	want := "drc1.42.7.register." + tok.ID() + ".REDACTED"
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
		for _, s := range []string{secret, parts[4], parts[5]} {
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
	f.Add(mustIssue(f, i, math.MaxInt64, math.MaxUint64, PurposeNonce).Secret())
	f.Add("drc1.1.1.register.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
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
	})
}
