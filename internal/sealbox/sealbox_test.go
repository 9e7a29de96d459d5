package sealbox

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testKey has bytes whose base64 contains both '+'/'/' and '-'/'_' alphabets' characters.
var testKey = func() []byte {
	k := make([]byte, KeySize)
	for i := range k {
		k[i] = byte(0xf8 + i*37)
	}
	return k
}()

func mustNew(t testing.TB, key []byte) *Box {
	t.Helper()
	b, err := New(key)
	require.NoError(t, err, "New()")
	return b
}

func TestNewKeyForms(t *testing.T) {
	want := mustNew(t, testKey).KeyID()
	tests := []struct {
		name string
		key  string
	}{
		{name: "raw", key: string(testKey)},
		{name: "hex lower", key: hex.EncodeToString(testKey)},
		{name: "hex upper", key: strings.ToUpper(hex.EncodeToString(testKey))},
		{name: "base64 std padded", key: base64.StdEncoding.EncodeToString(testKey)},
		{name: "base64 std unpadded", key: base64.RawStdEncoding.EncodeToString(testKey)},
		{name: "base64 url padded", key: base64.URLEncoding.EncodeToString(testKey)},
		{name: "base64 url unpadded", key: base64.RawURLEncoding.EncodeToString(testKey)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New([]byte(tt.key))
			require.NoError(t, err, "New()")
			assert.Equal(t, want, b.KeyID(), "KeyID() = %s, want %s (a different key was decoded)", b.KeyID(), want)
		})
	}
}

func TestNewKeyErrors(t *testing.T) {
	hexKey := hex.EncodeToString(testKey)
	b64 := base64.StdEncoding.EncodeToString(testKey)
	tests := []struct {
		name string
		key  string
	}{
		{name: "empty", key: ""},
		{name: "31 bytes", key: string(testKey[:31])},
		{name: "33 bytes", key: string(testKey) + "x"},
		{name: "hex with a non-hex character", key: "zz" + hexKey[2:]},
		{name: "hex of 31 bytes", key: hexKey[:62]},
		{name: "base64 with an invalid character", key: "*" + b64[1:]},
		{name: "base64 of 33 bytes", key: base64.RawStdEncoding.EncodeToString(append(bytes.Clone(testKey), 1))},
		{name: "base64 with non-zero padding bits", key: b64[:42] + "B="},
		{name: "base64 with mixed alphabets", key: "-+" + b64[2:]},
		{name: "passphrase", key: "correct horse battery staple"},
		{name: "hex with a trailing newline", key: hexKey + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New([]byte(tt.key))
			require.ErrorIs(t, err, ErrKey, "New() error = %v, want ErrKey", err)
			if tt.key != "" {
				assert.NotContains(t, err.Error(), tt.key, "error echoes the key")
			}
			assert.True(t, strings.HasPrefix(err.Error(), "sealbox: "), "error %q lacks the package prefix", err)
		})
	}
}

func TestSealOpen(t *testing.T) {
	b := mustNew(t, testKey)
	tests := []struct {
		name      string
		plaintext []byte
		aad       []byte
	}{
		{name: "secret", plaintext: []byte("runner-token-123"), aad: []byte("task/42")},
		{name: "empty plaintext", plaintext: []byte{}, aad: []byte("task/42")},
		{name: "no aad", plaintext: []byte("x"), aad: nil},
		{name: "large", plaintext: bytes.Repeat([]byte{0xab}, 1<<20), aad: []byte("task/1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sealed, err := b.Seal(tt.plaintext, tt.aad)
			require.NoError(t, err, "Seal()")
			assert.Len(t, sealed, len(tt.plaintext)+Overhead, "len(sealed)")
			if len(tt.plaintext) > 4 {
				assert.False(t, bytes.Contains(sealed, tt.plaintext), "sealed value contains the plaintext")
			}
			got, err := b.Open(sealed, tt.aad)
			require.NoError(t, err, "Open()")
			assert.Equal(t, string(tt.plaintext), string(got), "Open()")
			// A second Box from the same key (a restarted controller) opens it too.
			got, err = mustNew(t, []byte(hex.EncodeToString(testKey))).Open(sealed, tt.aad)
			if assert.NoError(t, err, "Open() with a new Box") {
				assert.Equal(t, string(tt.plaintext), string(got), "Open() with a new Box")
			}
		})
	}
}

func TestSealIsRandomized(t *testing.T) {
	b := mustNew(t, testKey)
	s1, _ := b.Seal([]byte("same"), []byte("task/1"))
	s2, _ := b.Seal([]byte("same"), []byte("task/1"))
	assert.NotEqual(t, s1, s2, "two seals of the same plaintext are equal")
}

func TestOpenErrors(t *testing.T) {
	b := mustNew(t, testKey)
	otherKey := bytes.Repeat([]byte{7}, KeySize)
	sealed, err := b.Seal([]byte("runner-token-123"), []byte("task/42"))
	require.NoError(t, err)
	flip := func(i int) []byte {
		s := bytes.Clone(sealed)
		s[i] ^= 0x01
		return s
	}
	tests := []struct {
		name    string
		box     *Box
		sealed  []byte
		aad     string
		wantErr error
	}{
		{name: "wrong key", box: mustNew(t, otherKey), sealed: sealed, aad: "task/42", wantErr: ErrWrongKey},
		{name: "wrong aad", box: b, sealed: sealed, aad: "task/43", wantErr: ErrOpen},
		{name: "empty aad", box: b, sealed: sealed, aad: "", wantErr: ErrOpen},
		{name: "aad with extra byte", box: b, sealed: sealed, aad: "task/420", wantErr: ErrOpen},
		{name: "unknown version", box: b, sealed: append([]byte{2}, sealed[1:]...), aad: "task/42", wantErr: ErrOpen},
		{name: "tampered nonce", box: b, sealed: flip(1 + keyIDSize), aad: "task/42", wantErr: ErrOpen},
		{name: "tampered ciphertext", box: b, sealed: flip(headerLen), aad: "task/42", wantErr: ErrOpen},
		{name: "tampered tag", box: b, sealed: flip(len(sealed) - 1), aad: "task/42", wantErr: ErrOpen},
		{name: "tampered key id", box: b, sealed: flip(1), aad: "task/42", wantErr: ErrWrongKey},
		{name: "truncated by one", box: b, sealed: sealed[:len(sealed)-1], aad: "task/42", wantErr: ErrOpen},
		{name: "truncated to the header", box: b, sealed: sealed[:headerLen], aad: "task/42", wantErr: ErrOpen},
		{name: "empty", box: b, sealed: nil, aad: "task/42", wantErr: ErrOpen},
		{name: "extended", box: b, sealed: append(bytes.Clone(sealed), 0), aad: "task/42", wantErr: ErrOpen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.box.Open(tt.sealed, []byte(tt.aad))
			require.ErrorIs(t, err, tt.wantErr, "Open() = %q, %v; want error %v", got, err, tt.wantErr)
			assert.Nil(t, got, "Open() returned %q with an error", got)
		})
	}
}

func TestOpenEveryTamperedByte(t *testing.T) {
	b := mustNew(t, testKey)
	sealed, _ := b.Seal([]byte("secret"), []byte("task/7"))
	for i := range sealed {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			s := bytes.Clone(sealed)
			s[i] ^= mask
			_, err := b.Open(s, []byte("task/7"))
			require.True(t, errors.Is(err, ErrOpen) || errors.Is(err, ErrWrongKey), "byte %d ^ %#x: Open() error = %v, want ErrOpen or ErrWrongKey", i, mask, err)
		}
	}
	for n := range len(sealed) {
		_, err := b.Open(sealed[:n], []byte("task/7"))
		require.ErrorIs(t, err, ErrOpen, "truncated to %d: Open() error", n)
	}
}

// FuzzOpen: whatever bytes are presented, Open returns a plaintext only for a value sealed
// with this key and aad (anything else is ErrOpen or ErrWrongKey); a value sealed from the
// fuzzed plaintext opens to exactly it, and changing any one of its bytes or its aad is refused.
func FuzzOpen(f *testing.F) {
	b := mustNew(f, testKey)
	sealed, _ := b.Seal([]byte("secret"), []byte("task/1"))
	f.Add(sealed, []byte("task/1"), uint16(0), byte(1))
	f.Add(sealed[:Overhead], []byte("task/1"), uint16(30), byte(0x80))
	f.Add([]byte{}, []byte{}, uint16(5), byte(0xff))
	f.Add([]byte{version, 0, 0, 0, 0}, []byte("task/1"), uint16(1000), byte(2))
	f.Fuzz(func(t *testing.T, data, aad []byte, at uint16, flip byte) {
		got, err := b.Open(data, aad)
		if err != nil {
			require.True(t, errors.Is(err, ErrOpen) || errors.Is(err, ErrWrongKey), "Open() error = %v, want ErrOpen or ErrWrongKey", err)
			assert.Nil(t, got)
		} else {
			// Whatever opens must re-seal and open to the same plaintext.
			again, err := b.Seal(got, aad)
			require.NoError(t, err)
			got2, err := b.Open(again, aad)
			require.NoError(t, err, "the re-sealed value")
			assert.Equal(t, got, got2, "the re-sealed value")
		}

		// Round trip of the fuzzed bytes as a plaintext, and refusal of any one change.
		sealed, err := b.Seal(data, aad)
		require.NoError(t, err)
		require.Len(t, sealed, len(data)+Overhead)
		opened, err := b.Open(sealed, aad)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(data, opened), "Open(Seal(%q)) = %q", data, opened)
		if flip != 0 {
			altered := bytes.Clone(sealed)
			altered[int(at)%len(altered)] ^= flip
			_, err = b.Open(altered, aad)
			assert.True(t, errors.Is(err, ErrOpen) || errors.Is(err, ErrWrongKey), "byte %d changed: Open() error = %v", int(at)%len(altered), err)
		}
		_, err = b.Open(sealed, append(bytes.Clone(aad), flip))
		require.ErrorIs(t, err, ErrOpen, "opened with another aad")
	})
}

func FuzzNew(f *testing.F) {
	f.Add([]byte(hex.EncodeToString(testKey)))
	f.Add([]byte(base64.StdEncoding.EncodeToString(testKey)))
	f.Add([]byte(base64.RawURLEncoding.EncodeToString(testKey)))
	f.Add(testKey)
	f.Add([]byte("short"))
	f.Fuzz(func(t *testing.T, key []byte) {
		b, err := New(key)
		if err != nil {
			require.ErrorIs(t, err, ErrKey, "New() error = %v, want ErrKey", err)
			if len(key) >= 8 {
				require.NotContains(t, err.Error(), string(key), "error echoes the key")
			}
			return
		}
		sealed, err := b.Seal([]byte("x"), nil)
		require.NoError(t, err)
		_, err = b.Open(sealed, nil)
		require.NoError(t, err, "Open()")
	})
}
