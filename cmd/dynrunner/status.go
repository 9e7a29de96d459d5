package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// statusReport is what the controller serves at /status and `dynrunner status` prints.
type statusReport struct {
	Version    string   `json:"version"`
	Components []string `json:"components"`
	PodBackend string   `json:"pod_backend,omitempty"`
	Ready      bool     `json:"ready"`
	// Warnings are the boot's warnings about what jobs can reach, as logged.
	Warnings []string `json:"warnings"`
	// Fleet is the whole deployment as this controller reads it: every component process
	// alive (over NATS) and the live work (its view); nil with FleetError when it could not
	// be read.
	Fleet      *fleet.Report `json:"fleet,omitempty"`
	FleetError string        `json:"fleet_error,omitempty"`
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

// statusHandler serves the controller's status report as JSON, with the fleet fleetOf reads
// (when not nil).
func statusHandler(base statusReport, ready *atomic.Bool, w *bootWarnings, fleetOf func(context.Context) (fleet.Report, error)) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		r := base
		r.Components = slices.Clone(base.Components)
		r.Ready = ready.Load()
		r.Warnings = w.list()
		if fleetOf != nil {
			ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
			f, err := fleetOf(ctx)
			cancel()
			if err != nil {
				r.FleetError = err.Error()
			} else {
				r.Fleet = &f
			}
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(r)
	})
}

// runStatus prints the fleet's status: with NATS_URL read over NATS (as NATS_USER, the
// read-only dynrunner-status on a cluster with deploy/nats/permissions.conf), otherwise from the
// /status of the controller whose HTTP_LISTEN getenv names. It fails, after printing, when no
// scheduler or no facade is alive (fleet.ErrIncomplete).
func runStatus(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := statusSettings(getenv)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if cfg.url == "" {
		r, err := readFleet(ctx, cfg)
		if err != nil {
			return err
		}
		if *asJSON {
			if err := json.NewEncoder(out).Encode(r); err != nil {
				return err
			}
		} else if err := printFleet(out, r); err != nil {
			return err
		}
		return r.Err()
	}
	r, err := fetchStatus(ctx, cfg.url)
	if err != nil {
		return err
	}
	if *asJSON {
		err = json.NewEncoder(out).Encode(r)
	} else {
		err = printStatus(out, r)
	}
	if err != nil {
		return err
	}
	if r.Fleet != nil {
		return r.Fleet.Err()
	}
	return nil
}

// statusConfig is the configuration of `dynrunner status`: either the NATS to read the fleet
// from, with the tiers' concurrency, or the /status URL of a controller.
type statusConfig struct {
	// nats is the NATS_URL connection; set when url is empty.
	nats natsconn.Config
	// pod and vm are POD_CONCURRENCY and VM_CONCURRENCY, with nats: the autoscaling of a tier
	// with no worker online is decided from them.
	pod, vm int
	// url is the /status of the controller at HTTP_LISTEN, when NATS_URL is empty.
	url string
}

// statusSettings reads the configuration of `dynrunner status` from getenv: every variable it
// reads, before any connection. With NATS_URL it reads the NATS variables and the tiers'
// concurrency; without, HTTP_LISTEN.
func statusSettings(getenv func(string) string) (statusConfig, error) {
	if getenv("NATS_URL") == "" {
		url, err := statusURL(getenv)
		if err != nil {
			return statusConfig{}, err
		}
		return statusConfig{url: url}, nil
	}
	nc, err := eventsNATSConfig(getenv)
	if err != nil {
		return statusConfig{}, err
	}
	nc.Name = "dynrunner status"
	pod, vm, err := concurrencyOf(getenv)
	if err != nil {
		return statusConfig{}, err
	}
	return statusConfig{nats: nc, pod: pod, vm: vm}, nil
}

// readFleet reads the fleet over cfg.nats.
func readFleet(ctx context.Context, cfg statusConfig) (fleet.Report, error) {
	nc, err := natsconn.Connect(cfg.nats)
	if err != nil {
		return fleet.Report{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc.NC)
	if err != nil {
		return fleet.Report{}, fmt.Errorf("jetstream: %w", err)
	}
	r, err := fleet.Read(ctx, js, time.Now)
	if err != nil {
		return fleet.Report{}, fmt.Errorf("read the fleet at NATS_URL=%s: %w", cfg.nats.URL, err)
	}
	r.Autoscale = r.Decisions(perWorker([]string{"pod", "vm"}, cfg.pod, cfg.vm))
	return r, nil
}

// concurrencyOf reads POD_CONCURRENCY and VM_CONCURRENCY as the controller does (defaults 4
// and 1): `dynrunner status` decides the autoscaling of a tier with no worker online from them.
func concurrencyOf(getenv func(string) string) (pod, vm int, err error) {
	pod, vm = config.DefaultPodConcurrency, config.DefaultVMConcurrency
	for name, v := range map[string]*int{"POD_CONCURRENCY": &pod, "VM_CONCURRENCY": &vm} {
		raw := strings.TrimSpace(getenv(name))
		if raw == "" {
			continue
		}
		n, perr := strconv.Atoi(raw)
		if perr != nil || n < 1 {
			return 0, 0, fmt.Errorf("%s=%q: want an integer of at least 1", name, raw)
		}
		*v = n
	}
	return pod, vm, nil
}

// fetchStatus reads a controller's /status at url.
func fetchStatus(ctx context.Context, url string) (statusReport, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return statusReport{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return statusReport{}, fmt.Errorf("no controller answers at %s (is one running, with this HTTP_LISTEN? or set NATS_URL to read the fleet from NATS): %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusReport{}, fmt.Errorf("%s: %s", url, resp.Status)
	}
	var r statusReport
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&r); err != nil {
		return statusReport{}, fmt.Errorf("%s: %w", url, err)
	}
	return r, nil
}

// statusURL is the /status URL of the controller whose HTTP_LISTEN getenv names.
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
	if r.FleetError != "" {
		fmt.Fprintf(&b, "fleet: could not be read: %s\n", r.FleetError)
	}
	if _, err := io.WriteString(out, b.String()); err != nil {
		return err
	}
	if r.Fleet == nil {
		return nil
	}
	_, _ = io.WriteString(out, "\n")
	return printFleet(out, *r.Fleet)
}

// printFleet prints a fleet report for humans: a table of the components alive, the live work
// by tier and phase, the workers' capacity, and what is missing.
func printFleet(out io.Writer, r fleet.Report) error {
	var b strings.Builder
	var counts []string
	for _, k := range liveness.Kinds {
		counts = append(counts, fmt.Sprintf("%d %s", r.Count[k], k))
	}
	fmt.Fprintf(&b, "fleet at %s: %s\n", r.At.Format(time.RFC3339), strings.Join(counts, ", "))
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tHOST\tINSTANCE\tVERSION\tUP\tLAST BEAT\tDETAILS")
	for _, c := range r.Components {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s ago\t%s\n", c.Kind, c.Host, c.Instance, c.Version,
			since(r.At, c.StartedAt), since(r.At, c.LastBeat), componentDetails(c))
	}
	_ = tw.Flush()
	fmt.Fprintf(&b, "live work: %d assignments\n", r.Live.Total)
	for _, tier := range slices.Sorted(maps.Keys(r.Live.ByTierPhase)) {
		phases := r.Live.ByTierPhase[tier]
		var parts []string
		for _, ph := range slices.Sorted(maps.Keys(phases)) {
			parts = append(parts, fmt.Sprintf("%s %d", ph, phases[ph]))
		}
		fmt.Fprintf(&b, "  %s: %d (%s)\n", tier, r.Live.ByTier[tier], strings.Join(parts, ", "))
	}
	if n := r.Live.ByForge[assignment.ForgeGitHub.String()]; n > 0 {
		fmt.Fprintf(&b, "  of which GitHub slots: %d (%d running a job GitHub gave their runner, %d waiting for one or ending)\n",
			n, r.Live.GitHubJobs, n-r.Live.GitHubJobs)
	}
	for _, tier := range slices.Sorted(maps.Keys(r.Capacity)) {
		c := r.Capacity[tier]
		fmt.Fprintf(&b, "%s workers: %d of %d environments in flight\n", tier, c.InFlight, c.Capacity)
	}
	for _, tier := range slices.Sorted(maps.Keys(r.Autoscale)) {
		s := r.Autoscale[tier]
		fmt.Fprintf(&b, "%s autoscale: desired workers %d (%s)\n", tier, s.DesiredWorkers, s.Reason)
	}
	if r.Rejected > 0 {
		fmt.Fprintf(&b, "WARNING: %d records in %s are not heartbeats (written by whom?); ignored\n", r.Rejected, eventlog.BucketComponents)
	}
	if err := r.Err(); err != nil {
		fmt.Fprintf(&b, "NOT WORKING: %s\n", strings.TrimPrefix(err.Error(), fleet.ErrIncomplete.Error()+": "))
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// componentDetails is the DETAILS column: what a component's kind reports.
func componentDetails(c liveness.Record) string {
	switch {
	case c.Worker != nil && c.Worker.SafeToRemove():
		return fmt.Sprintf("draining, 0/%d in flight: safe to remove", c.Worker.Capacity)
	case c.Worker != nil && c.Worker.Draining:
		return fmt.Sprintf("draining, %d/%d in flight", c.Worker.InFlight, c.Worker.Capacity)
	case c.Worker != nil:
		return fmt.Sprintf("%d/%d in flight", c.Worker.InFlight, c.Worker.Capacity)
	case c.Scheduler != nil && c.Scheduler.ReconcileLease:
		return "holds the reconcile lease"
	case c.Scheduler != nil:
		return "standby for the reconcile lease"
	case c.Facade != nil:
		return c.Facade.URL
	}
	return ""
}

// since is how long before at t was, rounded to the second ("-" for the zero time).
func since(at, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return max(at.Sub(t), 0).Round(time.Second).String()
}
