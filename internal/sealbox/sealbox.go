package sealbox

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
)

const (
	// KeySize is the size of the decoded key in bytes.
	KeySize = 32

	version   = 0x01
	keyIDSize = 4
	nonceSize = 12
	tagSize   = 16
	headerLen = 1 + keyIDSize + nonceSize
	// Overhead is the number of bytes Seal adds to the plaintext.
	Overhead = headerLen + tagSize
)

var (
	// ErrKey reports key material that is not 32 bytes in an accepted form.
	ErrKey = errors.New("invalid key")
	// ErrWrongKey reports a sealed value whose key id is not the Box's: it was sealed with
	// another key.
	ErrWrongKey = errors.New("sealed with a different key")
	// ErrOpen reports a sealed value that does not open: truncated, altered, of an unknown
	// version, or opened with other AAD than it was sealed with.
	ErrOpen = errors.New("cannot open sealed value")
)

// Box seals and opens values with one key. It is safe for concurrent use.
type Box struct {
	aead  cipher.AEAD
	keyID [keyIDSize]byte
}

// New returns a Box for key, given in one of the forms the package documentation lists.
func New(key []byte) (*Box, error) {
	raw, err := decodeKey(key)
	if err != nil {
		return nil, err
	}
	defer clear(raw)
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("sealbox: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("sealbox: %w", err)
	}
	b := &Box{aead: aead}
	sum := sha256.Sum256(raw)
	copy(b.keyID[:], sum[:keyIDSize])
	return b, nil
}

// decodeKey returns a fresh copy of the 32 key bytes.
func decodeKey(key []byte) ([]byte, error) {
	switch len(key) {
	case KeySize:
		return bytes.Clone(key), nil
	case hex.EncodedLen(KeySize):
		raw := make([]byte, KeySize)
		if _, err := hex.Decode(raw, key); err != nil {
			clear(raw)
			// hex errors quote the offending byte; do not pass them on.
			return nil, fmt.Errorf("sealbox: key of %d characters is not hexadecimal: %w", len(key), ErrKey)
		}
		return raw, nil
	case base64.RawStdEncoding.EncodedLen(KeySize), base64.StdEncoding.EncodedLen(KeySize):
		for _, enc := range []*base64.Encoding{
			base64.RawURLEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.StdEncoding,
		} {
			raw := make([]byte, enc.DecodedLen(len(key)))
			n, err := enc.Strict().Decode(raw, key)
			if err == nil && n == KeySize {
				return raw[:n], nil
			}
			clear(raw)
		}
		return nil, fmt.Errorf("sealbox: key of %d characters is not base64 of %d bytes: %w", len(key), KeySize, ErrKey)
	default:
		return nil, fmt.Errorf("sealbox: key has %d bytes; want %d raw bytes, %d hexadecimal or %d-%d base64 characters: %w",
			len(key), KeySize, hex.EncodedLen(KeySize),
			base64.RawStdEncoding.EncodedLen(KeySize), base64.StdEncoding.EncodedLen(KeySize), ErrKey)
	}
}

// KeyID returns the hexadecimal key id of the Box's key, safe to log: an operator can
// compare it with the key id of a value that fails with ErrWrongKey.
func (b *Box) KeyID() string { return hex.EncodeToString(b.keyID[:]) }

// Seal encrypts plaintext and binds it to aad, which Open must be given again.
func (b *Box) Seal(plaintext, aad []byte) ([]byte, error) {
	out := make([]byte, headerLen, headerLen+len(plaintext)+tagSize)
	out[0] = version
	copy(out[1:], b.keyID[:])
	nonce := out[1+keyIDSize : headerLen]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("sealbox: nonce: %w", err)
	}
	return b.aead.Seal(out, nonce, plaintext, additionalData(out[:1+keyIDSize], aad)), nil
}

// Open decrypts a value made by Seal with the same key and aad. It fails with ErrWrongKey
// if the value was sealed with another key and with ErrOpen if it does not open otherwise.
func (b *Box) Open(sealed, aad []byte) ([]byte, error) {
	if len(sealed) < Overhead {
		return nil, fmt.Errorf("sealbox: sealed value of %d bytes is shorter than %d: %w", len(sealed), Overhead, ErrOpen)
	}
	if sealed[0] != version {
		return nil, fmt.Errorf("sealbox: unknown version %d: %w", sealed[0], ErrOpen)
	}
	id := sealed[1 : 1+keyIDSize]
	if !bytes.Equal(id, b.keyID[:]) {
		return nil, fmt.Errorf("sealbox: value has key id %x, this key is %s: %w", id, b.KeyID(), ErrWrongKey)
	}
	nonce := sealed[1+keyIDSize : headerLen]
	plaintext, err := b.aead.Open(nil, nonce, sealed[headerLen:], additionalData(sealed[:1+keyIDSize], aad))
	if err != nil {
		return nil, fmt.Errorf("sealbox: altered value or wrong aad: %w", ErrOpen)
	}
	return plaintext, nil
}

// additionalData authenticates the header with the caller's aad. The header has a fixed
// length, so the concatenation is unambiguous.
func additionalData(header, aad []byte) []byte {
	ad := make([]byte, 0, len(header)+len(aad))
	return append(append(ad, header...), aad...)
}
