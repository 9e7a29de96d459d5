package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

func runController(ctx context.Context, args []string, getenv func(string) string) error {
	if len(args) > 0 {
		return fmt.Errorf("controller takes no arguments; configure it with environment variables (docs/configuration.md)")
	}
	cfg, err := config.LoadController(getenv)
	if err != nil {
		return fmt.Errorf("configuration refused:\n%w", err)
	}
	log, err := newLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel, "controller")
	if err != nil {
		return err
	}
	return controller(ctx, cfg, log)
}

// The embedded server's operator credentials.
const (
	embeddedUser         = "dynrunner"
	embeddedPasswordFile = "nats.password"
)

// keys loads the controller's keys: the capability token issuer, the facade's runner token
// key, the task box and the event log's record key. The last two derive from
// TASK_ENCRYPTION_KEY_FILE, the first two from RUNNER_FACADE_CAPABILITY_KEY_FILE.
func keys(cfg config.Controller, log zerolog.Logger) (*captoken.Issuer, []byte, *sealbox.Box, []byte, error) {
	load := func(path, name string) ([]byte, error) {
		if cfg.GenerateKeys {
			k, created, err := secretfile.LoadOrCreate(path, 32)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if created {
				log.Info().Str("path", path).Msgf("generated %s", name)
			}
			return k, nil
		}
		k, err := secretfile.ReadMin(path, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return k, nil
	}
	capKey, err := load(cfg.CapabilityKeyFile, "RUNNER_FACADE_CAPABILITY_KEY_FILE")
	if err != nil {
		return nil, nil, nil, nil, err
	}
	issuer, err := captoken.NewIssuer(capKey)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("RUNNER_FACADE_CAPABILITY_KEY_FILE: %w", err)
	}
	taskKey, err := load(cfg.TaskKeyFile, "TASK_ENCRYPTION_KEY_FILE")
	if err != nil {
		return nil, nil, nil, nil, err
	}
	box, err := sealbox.New(taskKey)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("TASK_ENCRYPTION_KEY_FILE: %w", err)
	}
	// The facade's runner tokens use a key derived from the capability key, never the key itself.
	runnerKey := deriveKey(capKey, "dynrunner facade runner tokens v1")
	// Records are authenticated with a key derived from the task key: every component that
	// may write to the event log holds it, nobody who holds only the NATS password does.
	recordKey := deriveKey(taskKey, "dynrunner event log records v1")
	return issuer, runnerKey, box, recordKey, nil
}

// controller runs the configured components until ctx ends. The order of the steps matters:
// the pod tier's backend is built before the facade, because the docker backend's job network
// decides where the facade listens for its containers; the job network's firewall is installed
// once the facade listens and before any worker starts. What the steps set up is undone at exit
// in the reverse order.
func controller(ctx context.Context, cfg config.Controller, log zerolog.Logger) error {
	p := &plane{cfg: cfg, log: log, warns: &bootWarnings{}}
	defer p.close()
	if cfg.DrainTimeout > 0 && (cfg.Has(config.PodWorker) || cfg.Has(config.VMWorker)) {
		// A stop drains the workers first (DRAIN_SECS): the components run on until then.
		run, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		go p.drainOnStop(ctx, run, cancel)
		ctx = run
	}
	if err := p.open(ctx); err != nil {
		return err
	}
	if err := p.declareRunner(ctx); err != nil {
		return err
	}
	if err := p.loadDevCA(); err != nil {
		return err
	}
	pods, err := p.podTier(ctx)
	if err != nil {
		return err
	}
	if cfg.Has(config.Scheduler) {
		if err := p.startScheduler(); err != nil {
			return err
		}
	}
	if cfg.Has(config.Facade) {
		if err := p.startFacade(ctx, pods.jobNet); err != nil {
			return err
		}
	}
	withdraw, err := pods.jobNet.installFirewall(ctx, cfg, log)
	if err != nil {
		return err
	}
	p.onExit(withdraw)
	if cfg.Has(config.VMWorker) {
		if err := startVMWorker(ctx, p); err != nil {
			return err
		}
	}
	if cfg.Has(config.PodWorker) {
		if err := p.startPodWorker(pods); err != nil {
			return err
		}
	}
	p.follow()
	if err := p.serveHTTP(); err != nil {
		return err
	}
	err = p.g.Wait()
	log.Info().Msg("controller stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// onlyFrom serves callers from net only: the facade's guest listener answers guests alone.
func onlyFrom(net netip.Prefix, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || !net.Contains(ap.Addr().Unmap()) {
			http.Error(w, "dynrunner facade: the guest listener serves microVM guests only", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// serve runs srv on ln until ctx ends, then shuts it down within a bound.
func serve(ctx context.Context, srv *http.Server, ln net.Listener, tls bool) error {
	errc := make(chan error, 1)
	go func() {
		if tls {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newRejectedRecords creates the count of event bus messages rejected as unauthenticated or
// malformed, by reason, and registers it with reg.
func newRejectedRecords(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dynrunner_eventlog_rejected_total", Help: "Messages on the event bus rejected (not written with the event log's key, or malformed), by reason.",
	}, []string{"reason"})
	reg.MustRegister(c)
	return c
}

// rejectionReporter logs every message the event log refused to believe (once each) and counts
// it in rejected. The message's content is not logged: whoever wrote it chose it.
func rejectionReporter(log zerolog.Logger, rejected *prometheus.CounterVec) func(eventlog.Rejection) {
	return func(r eventlog.Rejection) {
		reason := "unauthenticated"
		if errors.Is(r.Err, eventlog.ErrMalformed) {
			reason = "malformed"
		}
		rejected.WithLabelValues(reason).Inc()
		ev := log.Error().Str("stream", r.Stream).Str("subject", r.Subject).Uint64("seq", r.Seq).Str("reason", reason).AnErr("cause", r.Err)
		if r.Quarantined {
			ev.Str("quarantined_to", eventlog.SubjectQuarantine).Msg("rejected a message on the event bus that this controller did not write; moved it to quarantine")
			return
		}
		ev.AnErr("quarantine_error", r.QuarantineErr).Msg("rejected a message on the event bus that this controller did not write; it could not be moved, readers skip it")
	}
}

// podBackendOf names the pod backend this process runs, or "" without the pod worker.
func podBackendOf(cfg config.Controller) string {
	if !cfg.Has(config.PodWorker) {
		return ""
	}
	return cfg.PodBackend
}

// executorEnv is the configuration the pod worker gives every environment, as environment
// variables: the executor contract without the assignment's and the backend's own settings,
// which the worker and the backend add.
func executorEnv(cfg config.Controller, facadeURL, runnerBin string) map[string]string {
	return executor.Config{
		FacadeURL: facadeURL, FacadeID: cfg.FacadeID, Renew: assignment.RenewEvery(cfg.Lease),
		Labels: executor.Labels(assignment.BackendPod), RunnerBin: runnerBin, RunnerSHA256: cfg.GiteaRunnerSHA256,
		RunnerVersion: cfg.GiteaRunnerVersion, SpiffeEndpointSocket: cfg.SpiffeEndpointSocket, LogFormat: cfg.LogFormat,
	}.Environ()
}
