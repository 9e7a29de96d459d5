package executor

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// MaxFacades is the most facades one facade URL list (RUNNER_FACADE_URL, DYNRUNNER_FACADE_URL)
// may name.
const MaxFacades = 16

// ErrFacadeURL: a facade URL list that ParseFacadeURLs refused.
var ErrFacadeURL = errors.New("bad facade URL")

// ParseFacadeURLs parses a facade URL list: one or more https://host[:port] URLs separated by
// commas (spaces around them are ignored), at most MaxFacades, duplicates dropped (the first
// kept), in the order given. A facade serves at its root: a URL with a path, query, fragment
// or user information is refused, as is an empty entry. Each URL is returned with a trailing
// slash removed. Errors wrap ErrFacadeURL and name the entry.
func ParseFacadeURLs(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%w: the list is empty; want https://host:port[,https://host:port...]", ErrFacadeURL)
	}
	parts := strings.Split(s, ",")
	var out []string
	seen := map[string]bool{}
	for i, p := range parts {
		p = strings.TrimRight(strings.TrimSpace(p), "/")
		if p == "" {
			return nil, fmt.Errorf("%w: entry %d of %q is empty; want https://host:port, comma-separated", ErrFacadeURL, i+1, s)
		}
		u, err := url.Parse(p)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: %q: %w", ErrFacadeURL, p, err)
		case u.Scheme != "https" || u.Host == "" || u.Hostname() == "":
			return nil, fmt.Errorf("%w: %q: the facade speaks mTLS only; want https://host:port", ErrFacadeURL, p)
		case u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
			return nil, fmt.Errorf("%w: %q: a facade serves at its root; want https://host:port, without user, path, query or fragment", ErrFacadeURL, p)
		}
		key := strings.ToLower(hostPort(u))
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, u.String())
	}
	if len(out) > MaxFacades {
		return nil, fmt.Errorf("%w: %d facades named; at most %d", ErrFacadeURL, len(out), MaxFacades)
	}
	return out, nil
}
