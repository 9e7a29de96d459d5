package captoken

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

const (
	// MinKeySize is the shortest key NewIssuer accepts, in bytes.
	MinKeySize = 32

	prefix    = "drc2"
	nonceSize = 16
	macSize   = sha256.Size
	idSize    = 16
	// maxExpires is the latest expiry a token can carry, in Unix seconds:
	// 9999-12-31T23:59:59Z, 12 digits.
	maxExpires = 253402300799
	// maxWireLen bounds the input Verify looks at: the longest token has 134 bytes
	// (prefix 4, task 19 digits, epoch 20 digits, purpose 8, expires 12 digits, nonce 22,
	// mac 43, 6 dots).
	maxWireLen = 136
)

var (
	// ErrShortKey reports a key shorter than MinKeySize.
	ErrShortKey = errors.New("key is too short")
	// ErrMalformed reports a string that is not a token in canonical wire form.
	ErrMalformed = errors.New("malformed token")
	// ErrBadMAC reports a well-formed token whose MAC does not verify: forged, altered, or
	// issued with another key.
	ErrBadMAC = errors.New("token mac does not verify")
	// ErrUnknownPurpose reports a purpose that is not one of the Purpose constants.
	ErrUnknownPurpose = errors.New("unknown purpose")
	// ErrInvalidExpiry reports an expiry Issue cannot put in a token: zero, or outside
	// 1970-01-01T00:00:01Z to 9999-12-31T23:59:59Z.
	ErrInvalidExpiry = errors.New("invalid expiry")
)

// Purpose says what a token may be used for.
type Purpose string

const (
	// PurposeRegister lets an environment register its ephemeral runner at the facade.
	PurposeRegister Purpose = "register"
	// PurposeNonce is reserved for the VM nonce endpoint.
	PurposeNonce Purpose = "nonce"
)

// ParsePurpose parses one of the Purpose constants and fails with ErrUnknownPurpose
// otherwise.
func ParsePurpose(s string) (Purpose, error) {
	switch p := Purpose(s); p {
	case PurposeRegister, PurposeNonce:
		return p, nil
	default:
		return "", fmt.Errorf("captoken: purpose %q: %w", s, ErrUnknownPurpose)
	}
}

// Issuer issues and verifies tokens with one key. It is safe for concurrent use.
type Issuer struct {
	key []byte
}

// NewIssuer returns an Issuer for key, the content of the capability key file. A key
// shorter than MinKeySize bytes fails with ErrShortKey.
func NewIssuer(key []byte) (*Issuer, error) {
	if len(key) < MinKeySize {
		return nil, fmt.Errorf("captoken: key has %d bytes, at least %d are required: %w", len(key), MinKeySize, ErrShortKey)
	}
	return &Issuer{key: append([]byte(nil), key...)}, nil
}

// Issue returns a new token for the assignment (task, epoch) and purpose that expires at
// expires, truncated to the second, so that the token never outlives the deadline it is
// issued for. The task and epoch must be positive (assignment.ErrInvalidID otherwise), the
// purpose known (ErrUnknownPurpose otherwise) and expires set and within the range that
// ErrInvalidExpiry names.
func (i *Issuer) Issue(task assignment.TaskID, epoch assignment.Epoch, purpose Purpose, expires time.Time) (Token, error) {
	if task <= 0 {
		return Token{}, fmt.Errorf("captoken: task id %d: %w", task, assignment.ErrInvalidID)
	}
	if epoch == 0 {
		return Token{}, fmt.Errorf("captoken: epoch 0: %w", assignment.ErrInvalidID)
	}
	if _, err := ParsePurpose(string(purpose)); err != nil {
		return Token{}, err
	}
	if expires.IsZero() {
		return Token{}, fmt.Errorf("captoken: no expiry: %w", ErrInvalidExpiry)
	}
	if sec := expires.Unix(); sec <= 0 || sec > maxExpires {
		return Token{}, fmt.Errorf("captoken: expiry %s: %w", expires.UTC().Format(time.RFC3339), ErrInvalidExpiry)
	}
	t := Token{task: task, epoch: epoch, purpose: purpose, expires: expires.Unix()}
	_, _ = rand.Read(t.nonce[:]) // crypto/rand.Read never fails.
	t.mac = i.sum(t.signed())
	return t, nil
}

// Verify parses the wire form of a token and checks its MAC in constant time. It fails
// with ErrMalformed if wire is not a token in canonical form and with ErrBadMAC if the MAC
// does not verify. It does not check the expiry, single use, the epoch or the purpose: see
// the package documentation.
func (i *Issuer) Verify(wire string) (Token, error) {
	t, err := parse(wire)
	if err != nil {
		return Token{}, err
	}
	want := i.sum(t.signed())
	if !hmac.Equal(t.mac[:], want[:]) {
		return Token{}, fmt.Errorf("captoken: token %s: %w", t.ID(), ErrBadMAC)
	}
	return t, nil
}

func (i *Issuer) sum(signed string) [macSize]byte {
	h := hmac.New(sha256.New, i.key)
	h.Write([]byte(signed))
	var out [macSize]byte
	h.Sum(out[:0])
	return out
}

var b64 = base64.RawURLEncoding.Strict()

// parse parses the canonical wire form. Its errors do not quote the input.
func parse(wire string) (Token, error) {
	malformed := func(what string) (Token, error) {
		return Token{}, fmt.Errorf("captoken: %s: %w", what, ErrMalformed)
	}
	if len(wire) > maxWireLen {
		return malformed("too long")
	}
	parts := strings.Split(wire, ".")
	if parts[0] != prefix {
		return malformed("unknown version")
	}
	if len(parts) != 7 {
		return malformed(fmt.Sprintf("%d fields, want 7", len(parts)))
	}
	var t Token
	task, err := assignment.ParseTaskID(parts[1])
	if err != nil {
		return malformed("task id")
	}
	epoch, err := assignment.ParseEpoch(parts[2])
	if err != nil {
		return malformed("epoch")
	}
	purpose, err := ParsePurpose(parts[3])
	if err != nil {
		return malformed("purpose")
	}
	expires, ok := parseExpires(parts[4])
	if !ok {
		return malformed("expiry")
	}
	t.task, t.epoch, t.purpose, t.expires = task, epoch, purpose, expires
	if len(parts[5]) != b64.EncodedLen(nonceSize) {
		return malformed("nonce length")
	}
	if n, err := b64.Decode(t.nonce[:], []byte(parts[5])); err != nil || n != nonceSize {
		return malformed("nonce")
	}
	if len(parts[6]) != b64.EncodedLen(macSize) {
		return malformed("mac length")
	}
	if n, err := b64.Decode(t.mac[:], []byte(parts[6])); err != nil || n != macSize {
		return malformed("mac")
	}
	return t, nil
}

// parseExpires parses the canonical decimal Unix seconds of an expiry: digits only, no
// leading zero, from 1 to maxExpires.
func parseExpires(s string) (int64, bool) {
	if s == "" || s[0] == '0' || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil || sec > maxExpires {
		return 0, false
	}
	return sec, true
}

// Token is a verified or freshly issued capability token. The zero Token is not valid.
type Token struct {
	task    assignment.TaskID
	epoch   assignment.Epoch
	purpose Purpose
	expires int64 // Unix seconds
	nonce   [nonceSize]byte
	mac     [macSize]byte
}

// Task returns the task id the token is bound to.
func (t Token) Task() assignment.TaskID { return t.task }

// Epoch returns the fencing epoch the token is bound to.
func (t Token) Epoch() assignment.Epoch { return t.epoch }

// Purpose returns what the token may be used for.
func (t Token) Purpose() Purpose { return t.purpose }

// Expires returns when the token expires, in UTC, to the second. The token is valid up to
// and including that instant (see Expired).
func (t Token) Expires() time.Time { return time.Unix(t.expires, 0).UTC() }

// Expired reports whether the token has expired at now: whether now is after Expires.
func (t Token) Expired(now time.Time) bool { return now.After(t.Expires()) }

// ID returns a non-secret identifier of the token: the hex of the first 16 bytes of
// SHA-256 of its nonce. It is safe to log and to store, and is the key under which the
// caller records redemption.
func (t Token) ID() string {
	sum := sha256.Sum256(t.nonce[:])
	return hex.EncodeToString(sum[:idSize])
}

// Secret returns the wire form: the bearer secret to hand to the environment. Never log
// it.
func (t Token) Secret() string {
	return t.signed() + "." + base64.RawURLEncoding.EncodeToString(t.mac[:])
}

// signed returns the part of the wire form the MAC covers.
func (t Token) signed() string {
	return prefix + "." + t.task.String() + "." + t.epoch.String() + "." + string(t.purpose) + "." +
		strconv.FormatInt(t.expires, 10) + "." + base64.RawURLEncoding.EncodeToString(t.nonce[:])
}

// String returns the redacted form "drc2.<task>.<epoch>.<purpose>.<expiry>.<id>.REDACTED",
// the expiry in RFC 3339 (UTC).
func (t Token) String() string {
	return prefix + "." + t.task.String() + "." + t.epoch.String() + "." + string(t.purpose) + "." +
		t.Expires().Format(time.RFC3339) + "." + t.ID() + ".REDACTED"
}

// GoString returns the redacted form, for %#v.
func (t Token) GoString() string { return "captoken.Token(" + t.String() + ")" }

// Format writes the redacted form for every verb, so that no fmt verb (%x included)
// reaches the secret fields.
func (t Token) Format(f fmt.State, verb rune) {
	switch verb {
	case 'q':
		fmt.Fprintf(f, "%q", t.String())
	case 'v':
		if f.Flag('#') {
			_, _ = f.Write([]byte(t.GoString()))
			return
		}
		_, _ = f.Write([]byte(t.String()))
	default:
		_, _ = f.Write([]byte(t.String()))
	}
}

// LogValue returns the redacted form for log/slog.
func (t Token) LogValue() slog.Value { return slog.StringValue(t.String()) }

// MarshalJSON returns the redacted form as a JSON string, for JSON loggers. A Token
// cannot be stored as JSON: store its ID, and hand out Secret.
func (t Token) MarshalJSON() ([]byte, error) { return json.Marshal(t.String()) }

var (
	_ fmt.Stringer   = Token{}
	_ fmt.GoStringer = Token{}
	_ fmt.Formatter  = Token{}
	_ slog.LogValuer = Token{}
	_ json.Marshaler = Token{}
)
