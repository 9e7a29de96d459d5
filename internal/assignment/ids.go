package assignment

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// TaskID is the forge's task id (Gitea's runnerv1.Task.Id). It is always positive.
type TaskID int64

// ParseTaskID parses a decimal, positive task id.
func ParseTaskID(s string) (TaskID, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != s {
		return 0, fmt.Errorf("assignment: task id %q: %w", s, ErrInvalidID)
	}
	return TaskID(n), nil
}

func (t TaskID) String() string { return strconv.FormatInt(int64(t), 10) }

// Epoch is the fencing epoch of an assignment: the JetStream stream sequence of the append that
// handed the assignment over (its claim, or a reclaim). Lease renewals keep it. Zero is no epoch.
type Epoch uint64

// ParseEpoch parses a decimal, positive epoch.
func ParseEpoch(s string) (Epoch, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != s {
		return 0, fmt.Errorf("assignment: epoch %q: %w", s, ErrInvalidID)
	}
	return Epoch(n), nil
}

func (e Epoch) String() string { return strconv.FormatUint(uint64(e), 10) }

// ErrInvalidID reports a task id or epoch that does not parse.
var ErrInvalidID = errors.New("invalid identifier")

// ForgeURL is the forge's own base URL as its jobs see it (Gitea's ROOT_URL), without a
// trailing slash: http(s)://host[:port][/path]. The zero value means unknown.
type ForgeURL string

// ParseForgeURL accepts an absolute http or https URL with a host and optionally a path
// (Gitea may be served below one), and nothing else: no user information, query or fragment.
// It returns the URL without its trailing slash.
func ParseForgeURL(s string) (ForgeURL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" ||
		u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || strings.ContainsAny(s, " \t\r\n") {
		return "", fmt.Errorf("assignment: forge URL %q: want http(s)://host[:port][/path]: %w", s, ErrInvalidID)
	}
	return ForgeURL(strings.TrimRight(u.String(), "/")), nil
}

// URL returns the parsed URL; f must come from ParseForgeURL.
func (f ForgeURL) URL() *url.URL {
	u, _ := url.Parse(string(f))
	return u
}

func (f ForgeURL) String() string { return string(f) }
