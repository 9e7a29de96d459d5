package vmworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/launcher"
)

// EndpointConfig configures the nonce endpoint.
type EndpointConfig struct {
	// Listen is the bridge address and port, e.g. 10.213.0.1:7001; never a wildcard.
	Listen string
	// Allowed is the bridge network; requests from anywhere else are refused.
	Allowed netip.Prefix
	// Executor is what every guest receives with its token and its assignment's task, epoch
	// and forge URL (executor.NewGrant): the facade's guest URL and SPIFFE ID, the pinned
	// runner (Executor.RunnerBin is served at executor.RunnerPath), labels, renewal interval.
	Executor executor.Config
	// GitHub is what every GitHub slot's guest receives with its slot and JIT configuration
	// (executor.NewGitHubGrant): the pinned GitHub Actions runner's path in the guest image
	// and its SHA-256 (GITHUB_VM_RUNNER_BIN, GITHUB_VM_RUNNER_SHA256). Empty when this worker
	// serves no GitHub slots.
	GitHub executor.GitHubConfig
	// FacadeCA returns the facade's CA bundle (PEM) at the time of each redemption, so a
	// rotated CA reaches new guests.
	FacadeCA func() ([]byte, error)
	Log      zerolog.Logger
}

// Assignments is what the Endpoint reads of the event log: the assignment a nonce was issued
// for. *eventlog.Log is one.
type Assignments interface {
	Get(ctx context.Context, task assignment.TaskID) (assignment.State, error)
}

var _ Assignments = (*eventlog.Log)(nil)

// Endpoint serves the nonce endpoint.
type Endpoint struct {
	cfg    EndpointConfig
	nonces *Nonces
	log    Assignments
}

// NewEndpoint returns an Endpoint; it refuses a wildcard or out-of-network listen address.
func NewEndpoint(cfg EndpointConfig, nonces *Nonces, log Assignments) (*Endpoint, error) {
	ap, err := netip.ParseAddrPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("vmworker: nonce endpoint address %q: %w", cfg.Listen, err)
	}
	if ap.Addr().IsUnspecified() || !cfg.Allowed.Contains(ap.Addr()) {
		return nil, fmt.Errorf("vmworker: nonce endpoint address %s must be the microVM bridge's own address in %s", cfg.Listen, cfg.Allowed)
	}
	return &Endpoint{cfg: cfg, nonces: nonces, log: log}, nil
}

// Handler serves POST /v1/redeem, GET /v1/runner and GET /v1/ping.
func (e *Endpoint) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+executor.RedeemPath, e.redeem)
	mux.HandleFunc("GET "+executor.RunnerPath, e.runner)
	mux.HandleFunc("GET /v1/ping", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "pong\n") })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || !e.cfg.Allowed.Contains(ap.Addr().Unmap()) {
			e.cfg.Log.Warn().Str("remote", r.RemoteAddr).Msg("nonce endpoint refused a caller outside the microVM bridge")
			http.Error(w, "dynrunner nonce endpoint: only microVM guests on the bridge are served", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// validRedeem reports whether req names an instance id in the canonical form instances are
// given out in (launcher.ParseInstanceID) and a well-formed nonce (launcher.ParseNonce).
func validRedeem(req executor.RedeemRequest) bool {
	_, ierr := launcher.ParseInstanceID(req.InstanceID)
	_, nerr := launcher.ParseNonce(req.Nonce)
	return ierr == nil && nerr == nil
}

func (e *Endpoint) redeem(w http.ResponseWriter, r *http.Request) {
	var req executor.RedeemRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || !validRedeem(req) {
		http.Error(w, "dynrunner nonce endpoint: want {\"instance_id\": <uuid>, \"nonce\": <url-safe nonce>}", http.StatusBadRequest)
		return
	}
	// Check the assignment before the nonce is spent, so a failed read costs the guest a retry,
	// not its job.
	task, epoch, err := e.nonces.Peek(r.Context(), req.InstanceID, req.Nonce)
	var forgeURL assignment.ForgeURL
	if err == nil {
		st, gerr := e.log.Get(r.Context(), task)
		switch {
		case gerr != nil && !errors.Is(gerr, assignment.ErrNotFound):
			e.cfg.Log.Error().Err(gerr).Msg("read the assignment of a nonce")
			http.Error(w, "dynrunner nonce endpoint: try again", http.StatusServiceUnavailable)
			return
		case gerr != nil || st.Epoch() != epoch || !st.Active():
			http.Error(w, "dynrunner nonce endpoint: the assignment is no longer current", http.StatusGone)
			return
		}
		forgeURL = st.ForgeURL
	}
	var cred Credential
	if err == nil {
		task, epoch, cred, err = e.nonces.Redeem(r.Context(), req.InstanceID, req.Nonce)
	}
	switch {
	case errors.Is(err, ErrUnknownNonce):
		http.Error(w, "dynrunner nonce endpoint: unknown nonce", http.StatusNotFound)
		return
	case errors.Is(err, ErrNonceRedeemed):
		e.cfg.Log.Warn().Str("instance_id", req.InstanceID).Msg("a nonce was presented again")
		http.Error(w, "dynrunner nonce endpoint: nonce already redeemed", http.StatusGone)
		return
	case err != nil:
		e.cfg.Log.Error().Err(err).Msg("redeem nonce")
		http.Error(w, "dynrunner nonce endpoint: try again", http.StatusServiceUnavailable)
		return
	}
	if cred.GitHub() {
		e.grantGitHub(w, req.InstanceID, task, epoch, cred.JITConfig)
		return
	}
	ca, err := e.cfg.FacadeCA()
	if err != nil {
		e.cfg.Log.Error().Err(err).Msg("facade CA for a guest")
		http.Error(w, "dynrunner nonce endpoint: try again", http.StatusServiceUnavailable)
		return
	}
	e.cfg.Log.Info().Int64(logkey.TaskID, int64(task)).Uint64(logkey.Epoch, uint64(epoch)).Str("instance_id", req.InstanceID).Msg("nonce redeemed")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	c := e.cfg.Executor
	c.Task, c.Epoch, c.ForgeURL = task, epoch, forgeURL
	_ = json.NewEncoder(w).Encode(executor.NewGrant(c, cred.Token, ca))
}

// grantGitHub answers a redeemed GitHub slot's nonce with its grant: the slot, the JIT
// configuration and the pinned runner's path in the guest image. Nothing of the facade: the
// runner talks to GitHub itself.
func (e *Endpoint) grantGitHub(w http.ResponseWriter, instance string, task assignment.TaskID, epoch assignment.Epoch, jit string) {
	logger := e.cfg.Log.With().Int64(logkey.TaskID, int64(task)).Uint64(logkey.Epoch, uint64(epoch)).Str("instance_id", instance).Logger()
	if e.cfg.GitHub.RunnerBin == "" {
		logger.Error().Msg("a GitHub slot's nonce was redeemed, but this nonce endpoint has no GitHub runner pin (GITHUB_VM_RUNNER_BIN)")
		http.Error(w, "dynrunner nonce endpoint: this endpoint serves no GitHub slots", http.StatusServiceUnavailable)
		return
	}
	logger.Info().Msg("nonce redeemed for a GitHub slot")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	c := e.cfg.GitHub
	c.Task, c.Epoch = task, epoch
	_ = json.NewEncoder(w).Encode(executor.NewGitHubGrant(c, jit))
}

// runner serves the pinned Gitea runner binary; it is not secret, and the guest checks its
// SHA-256 against the grant before running it.
func (e *Endpoint) runner(w http.ResponseWriter, r *http.Request) {
	f, err := os.Open(e.cfg.Executor.RunnerBin)
	if err != nil {
		http.Error(w, "dynrunner nonce endpoint: runner binary unavailable", http.StatusServiceUnavailable)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, "dynrunner nonce endpoint: runner binary unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("X-Runner-SHA256", e.cfg.Executor.RunnerSHA256)
	http.ServeContent(w, r, "gitea-runner", fi.ModTime(), f)
}

// Run serves the endpoint until ctx ends; it returns nil on cancellation.
func (e *Endpoint) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", e.cfg.Listen)
	if err != nil {
		return fmt.Errorf("vmworker: nonce endpoint: %w (is the microVM bridge up?)", err)
	}
	srv := &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("vmworker: nonce endpoint: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("vmworker: nonce endpoint: %w", err)
	}
	return nil
}
