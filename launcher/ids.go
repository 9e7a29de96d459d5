package launcher

import (
	"net/netip"
	"net/url"
	"strconv"

	"github.com/google/uuid"
)

// InstanceID identifies one VM: a UUID. Only the canonical lowercase form
// (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, hexadecimal digits a-f in lowercase) is accepted, so
// that the string, the directory name and the TAP name derived from it are always the same. The
// zero value is invalid.
type InstanceID struct{ b uuid.UUID }

// ParseInstanceID parses the canonical lowercase form of a UUID. It refuses the nil UUID, and
// the other forms uuid.Parse accepts (upper case, braces, a urn:uuid: prefix, no hyphens).
func ParseInstanceID(s string) (InstanceID, error) {
	u, err := uuid.Parse(s)
	if err != nil || u.String() != s {
		return InstanceID{}, invalidf("instance id %q: want a UUID in canonical lowercase form", clip(s))
	}
	id := InstanceID{b: u}
	if id.IsZero() {
		return InstanceID{}, invalidf("instance id %q: the nil UUID is not an instance id", s)
	}
	return id, nil
}

// IsZero reports whether id is the zero value.
func (id InstanceID) IsZero() bool { return id == InstanceID{} }

// String returns the canonical lowercase form.
func (id InstanceID) String() string { return id.b.String() }

// Short is the first 8 hexadecimal digits: the suffix of the TAP name and of the hostname.
func (id InstanceID) Short() string { return id.String()[:8] }

// MarshalText implements encoding.TextMarshaler.
func (id InstanceID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseInstanceID.
func (id *InstanceID) UnmarshalText(b []byte) error {
	v, err := ParseInstanceID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// Nonce is the single-use secret the guest presents at the nonce endpoint to fetch its
// registration token: 16 to 128 characters of the URL-safe base64 alphabet [A-Za-z0-9_-]. It is
// written into the seed ISO and nowhere else. String redacts it; Reveal returns it.
type Nonce struct{ s string }

// Nonce length bounds.
const (
	MinNonceLen = 16
	MaxNonceLen = 128
)

// ParseNonce validates a nonce. Errors never contain the value.
func ParseNonce(s string) (Nonce, error) {
	if len(s) < MinNonceLen || len(s) > MaxNonceLen {
		return Nonce{}, invalidf("nonce: %d characters, want %d to %d", len(s), MinNonceLen, MaxNonceLen)
	}
	for i := 0; i < len(s); i++ {
		if !nonceChar(s[i]) {
			return Nonce{}, invalidf("nonce: character %d is not in the URL-safe base64 alphabet [A-Za-z0-9_-]", i+1)
		}
	}
	return Nonce{s: s}, nil
}

func nonceChar(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// IsZero reports whether n is the zero value.
func (n Nonce) IsZero() bool { return n.s == "" }

// Reveal returns the nonce itself.
func (n Nonce) Reveal() string { return n.s }

// String redacts the nonce, so that it never ends up in a log by accident.
func (n Nonce) String() string {
	if n.s == "" {
		return ""
	}
	return "[nonce redacted]"
}

// Endpoint is the nonce endpoint the guest calls: http://<ip>:<port>, nothing else.
type Endpoint struct {
	Addr netip.AddrPort
}

// ParseEndpoint parses http://<ip>:<port> with an IPv4 literal (or a bracketed IPv6 literal)
// and an explicit port; it refuses user info, a path other than "/", a query and a fragment.
func ParseEndpoint(s string) (Endpoint, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Endpoint{}, invalidf("endpoint %q: %v", clip(s), err)
	}
	switch {
	case u.Scheme != "http":
		return Endpoint{}, invalidf("endpoint %q: want http://<ip>:<port>", clip(s))
	case u.User != nil:
		return Endpoint{}, invalidf("endpoint %q: user info is not allowed", clip(s))
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "":
		return Endpoint{}, invalidf("endpoint %q: a query or fragment is not allowed", clip(s))
	case u.Path != "" && u.Path != "/":
		return Endpoint{}, invalidf("endpoint %q: a path is not allowed", clip(s))
	}
	host, port := u.Hostname(), u.Port()
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" || ip.IsUnspecified() || ip.IsMulticast() {
		return Endpoint{}, invalidf("endpoint %q: the host must be an IP address", clip(s))
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || strconv.FormatUint(p, 10) != port {
		return Endpoint{}, invalidf("endpoint %q: want an explicit port 1-65535", clip(s))
	}
	return Endpoint{Addr: netip.AddrPortFrom(ip.Unmap(), uint16(p))}, nil
}

// IsZero reports whether e is the zero value.
func (e Endpoint) IsZero() bool { return !e.Addr.IsValid() }

// String returns http://<ip>:<port>.
func (e Endpoint) String() string {
	if e.IsZero() {
		return ""
	}
	return "http://" + e.Addr.String()
}

// clip shortens s for an error message (which quotes it with %q).
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
