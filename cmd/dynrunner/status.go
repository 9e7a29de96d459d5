package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/config"
)

// statusReport is what the controller serves at /status and `dynrunner status` prints.
type statusReport struct {
	Version    string   `json:"version"`
	Components []string `json:"components"`
	PodBackend string   `json:"pod_backend,omitempty"`
	Ready      bool     `json:"ready"`
	// Warnings are the boot's warnings about what jobs can reach, as logged.
	Warnings []string `json:"warnings"`
}

// bootWarnings collects the warnings a controller logs at boot, for /status.
type bootWarnings struct {
	mu   sync.Mutex
	msgs []string
}

// warn logs msg as a warning and keeps it for /status.
func (w *bootWarnings) warn(log zerolog.Logger, msg string) {
	log.Warn().Msg(msg)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *bootWarnings) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string{}, w.msgs...)
}

// statusHandler serves the controller's status report as JSON.
func statusHandler(base statusReport, ready *atomic.Bool, w *bootWarnings) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		r := base
		r.Components = slices.Clone(base.Components)
		r.Ready = ready.Load()
		r.Warnings = w.list()
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(r)
	})
}

// runStatus prints the status of the controller whose HTTP_LISTEN getenv names.
func runStatus(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	url, err := statusURL(getenv)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("no controller answers at %s (is one running, with this HTTP_LISTEN?): %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	var r statusReport
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&r); err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	if *asJSON {
		return json.NewEncoder(out).Encode(r)
	}
	return printStatus(out, r)
}

// statusURL is the configuration of `dynrunner status`: the /status URL of the controller
// whose HTTP_LISTEN getenv names.
func statusURL(getenv func(string) string) (string, error) {
	listen := cmp.Or(getenv("HTTP_LISTEN"), config.DefaultHTTPListen)
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("HTTP_LISTEN=%q: want host:port", listen)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/status", nil
}

func printStatus(out io.Writer, r statusReport) error {
	state := "not ready"
	if r.Ready {
		state = "ready"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "dynrunner controller %s: %s\n", r.Version, state)
	fmt.Fprintf(&b, "components:  %s\n", strings.Join(r.Components, ", "))
	if r.PodBackend != "" {
		fmt.Fprintf(&b, "pod backend: %s\n", r.PodBackend)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "WARNING: %s\n", w)
	}
	_, err := io.WriteString(out, b.String())
	return err
}
