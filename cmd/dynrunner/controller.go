package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/forge"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/launcher"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/scheduler"
)

func runController(ctx context.Context, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("controller takes no arguments; configure it with environment variables (docs/configuration.md)")
	}
	cfg, err := config.LoadController(os.Getenv)
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

// keys loads (or, with the embedded NATS, generates) the capability and task keys.
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

// controller runs the configured components until ctx ends.
func controller(ctx context.Context, cfg config.Controller, log zerolog.Logger) error {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("STATE_DIR: %w", err)
	}
	issuer, runnerKey, box, recordKey, err := keys(cfg, log)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	// The process's actor names it in the records and, for the pod and vm workers, in the
	// liveness bucket, where two processes must never share one: containers may share a
	// hostname and a pid (1), so a random instance suffix makes it unique.
	var inst [3]byte
	if _, err := rand.Read(inst[:]); err != nil {
		return fmt.Errorf("instance id: %w", err)
	}
	actor := fmt.Sprintf("%s/%d/%x", host, os.Getpid(), inst)

	natsCfg := natsconn.Config{URL: cfg.NATSURL, User: cfg.NATSUser, StoreDir: filepath.Join(cfg.StateDir, "jetstream"), Name: "dynrunner-controller " + actor}
	if cfg.Embedded() && cfg.NATSEmbedListen != "" {
		pw, _, err := secretfile.LoadOrCreate(filepath.Join(cfg.StateDir, embeddedPasswordFile), 24)
		if err != nil {
			return fmt.Errorf("embedded NATS password: %w", err)
		}
		natsCfg.Listen, natsCfg.User, natsCfg.Password = cfg.NATSEmbedListen, embeddedUser, string(pw)
	}
	if cfg.NATSPasswordFile != "" {
		pw, err := secretfile.Read(cfg.NATSPasswordFile)
		if err != nil {
			return fmt.Errorf("NATS_PASSWORD_FILE: %w", err)
		}
		natsCfg.Password = string(pw)
	}
	nc, err := natsconn.Connect(natsCfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	if cfg.Embedded() {
		log.Info().Str("store", natsCfg.StoreDir).Str("listen", natsCfg.Listen).Msg("embedded nats-server with JetStream started")
	}
	js, err := jetstream.New(nc.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := scheduler.NewMetrics(reg)
	facadeMetrics := facade.NewMetrics(reg)
	rejectedRecords := newRejectedRecords(reg)

	elCfg := eventlog.DefaultConfig()
	elCfg.Replicas = cfg.NATSReplicas
	elCfg.Key = recordKey
	elCfg.OnReject = rejectionReporter(log, rejectedRecords)
	evlog, err := eventlog.Open(ctx, js, elCfg)
	if err != nil {
		return err
	}
	view := eventlog.NewView()

	var ready []<-chan struct{}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return evlog.Watch(gctx, view) })
	ready = append(ready, view.Ready())

	var upstream forge.Forge
	var backends []assignment.Backend
	for _, t := range cfg.Tiers {
		backends = append(backends, assignment.Backend(t))
	}
	if cfg.Has(config.Scheduler) || cfg.Has(config.Facade) {
		// Every tier label is declared whether or not its tier is enabled here, so Gitea hands
		// a job for a disabled tier to the scheduler, which fails it with a clear message
		// instead of leaving it queued; and every process declares the same labels.
		labels := []string{scheduler.LabelSelfHosted, string(assignment.BackendPod), string(assignment.BackendVM)}
		g, err := connectForge(ctx, cfg, labels)
		if err != nil {
			return err
		}
		upstream = g
		log.Info().Str("gitea", cfg.GiteaURL).Strs("labels", labels).Msg("resident runner declared")
	}

	warns := &bootWarnings{}
	var facadeSrc workload.Source
	var devCA *workload.DevCA
	if cfg.Has(config.Facade) || cfg.Has(config.PodWorker) {
		if cfg.DevCA {
			devCA, err = workload.LoadOrCreateDevCA(filepath.Join(cfg.StateDir, "ca"), cfg.TrustDomain)
			if err != nil {
				return err
			}
			warns.warn(log.With().Str("ca", filepath.Join(cfg.StateDir, "ca")).Logger(), "DEVELOPMENT ONLY: SPIFFE_ENDPOINT_SOCKET is unset, so a built-in CA issues the SVIDs of the facade and of local environments; production uses SPIRE")
		}
	}

	// The pod tier's backend comes first: the docker backend's job network decides where the
	// facade listens for its containers.
	var pods podTier
	if cfg.Has(config.PodWorker) {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("pod worker: locate the dynrunner binary: %w", err)
		}
		plog := log.With().Str("component", "pod-worker").Str("backend", cfg.PodBackend).Logger()
		if pods, err = newPodTier(ctx, cfg, exe, plog, warns, phaseRecorder(evlog, "pod-worker@"+actor, time.Now, plog)); err != nil {
			return err
		}
	}

	if cfg.Has(config.Scheduler) {
		s := scheduler.New(scheduler.Config{
			Actor: "scheduler@" + actor, Backends: backends, Lease: cfg.Lease, Pickup: cfg.Pickup,
			Capacity:      map[assignment.Backend]int{assignment.BackendPod: cfg.PodConcurrency, assignment.BackendVM: cfg.VMConcurrency},
			FetchInterval: cfg.FetchInterval, FetchIntervalMax: 10 * cfg.FetchInterval, Keepalive: cfg.Keepalive,
			Reconcile: time.Second, ForgeURL: assignment.ForgeURL(cfg.GiteaURL), Box: box, Log: log.With().Str("component", "scheduler").Logger(), Metrics: metrics,
		}, upstream, evlog, view)
		g.Go(func() error { return s.Run(gctx) })
		ready = append(ready, s.Ready())
	}

	if cfg.Has(config.Facade) {
		if devCA != nil {
			hosts := facadeHosts(cfg.FacadeURL)
			if cfg.Has(config.VMWorker) {
				hosts = append(hosts, facadeHosts(cfg.VM.FacadeGuestURL)...)
			}
			if pods.jobNet.Managed {
				hosts = append(hosts, pods.jobNet.Gateway.String())
			}
			facadeSrc, err = devCA.ServerSource(cfg.FacadeID, 24*time.Hour, hosts)
		} else {
			facadeSrc, err = workload.FromWorkloadAPI(ctx, cfg.SpiffeEndpointSocket)
		}
		if err != nil {
			return fmt.Errorf("facade SVID: %w", err)
		}
		defer facadeSrc.Close()
		f := facade.New(facade.Config{
			Actor: "facade@" + actor, TrustDomain: cfg.TrustDomain, Lease: cfg.Lease, Issuer: issuer,
			RunnerKey: runnerKey, Box: box, Log: log.With().Str("component", "facade").Logger(), Metrics: facadeMetrics,
		}, upstream, evlog, view)
		ln, err := net.Listen("tcp", cfg.FacadeListen)
		if err != nil {
			return fmt.Errorf("RUNNER_FACADE_LISTEN: %w", err)
		}
		srv := f.Server(f.Handler(), workload.ServerTLSConfig(facadeSrc))
		facadeReady := make(chan struct{})
		close(facadeReady)
		ready = append(ready, facadeReady)
		g.Go(func() error { return serve(gctx, srv, ln, true) })
		log.Info().Str("listen", ln.Addr().String()).Str("spiffe_id", cfg.FacadeID.String()).Msg("facade serving mTLS")
		if addr := pods.jobNet.GatewayListen; addr != "" {
			jln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("facade on the job network's gateway: %w", err)
			}
			jsrv := f.Server(f.Handler(), workload.ServerTLSConfig(facadeSrc))
			g.Go(func() error { return serve(gctx, jsrv, jln, true) })
			log.Info().Str("listen", jln.Addr().String()).Str("network", pods.jobNet.Name).Msg("facade serving mTLS to job containers")
		}
		if cfg.Has(config.VMWorker) {
			if cfg.VM.Backend == "local" {
				if err := launcher.EnsureBridge(ctx, cfg.VM.LauncherRoot, cfg.VM.Bridge, cfg.VM.BridgeCIDR); err != nil {
					return err
				}
				if err := applyVMFirewall(ctx, cfg, log); err != nil {
					return err
				}
				defer removeVMFirewall(cfg, log)
			}
			gln, err := net.Listen("tcp", cfg.VM.FacadeGuestListen)
			if err != nil {
				return fmt.Errorf("RUNNER_FACADE_GUEST_LISTEN: %w", err)
			}
			gsrv := f.Server(onlyFrom(cfg.VM.GuestNet, f.GuestHandler()), workload.GuestServerTLSConfig(facadeSrc))
			g.Go(func() error { return serve(gctx, gsrv, gln, true) })
			log.Info().Str("listen", gln.Addr().String()).Msg("facade serving microVM guests (token-authenticated TLS, vm assignments only)")
		}
	}

	withdraw, err := pods.jobNet.installFirewall(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer withdraw()

	if cfg.Has(config.VMWorker) {
		if err := startVMWorker(ctx, gctx, g, cfg, log, actor, issuer, box, js, evlog, view, facadeSrc, &ready); err != nil {
			return err
		}
	}

	if cfg.Has(config.PodWorker) {
		var ident podworker.Identity
		if devCA != nil {
			ident = devIdentity{ca: devCA}
		}
		w := podworker.New(podworker.Config{
			Actor: "pod-worker@" + actor, Tier: assignment.BackendPod, Concurrency: cfg.PodConcurrency,
			Issuer: issuer, Identity: ident, Log: log.With().Str("component", "pod-worker").Logger(),
			ExecutorEnv: executorEnv(cfg, pods.facadeURL, pods.runnerBin),
		}, pods.backend, evlog, view)
		g.Go(func() error { return w.Run(gctx) })
		ready = append(ready, w.Ready())
	}

	var isReady atomic.Bool
	g.Go(func() error {
		for _, c := range ready {
			select {
			case <-c:
			case <-gctx.Done():
				return nil
			}
		}
		isReady.Store(true)
		log.Info().Strs("components", cfg.Components).Msg("controller ready")
		return nil
	})
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !isReady.Load() {
			http.Error(w, "not ready\n", http.StatusServiceUnavailable)
			return
		}
		// Ready means usable: a stream or bucket deleted under the controller fails every job.
		cctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := evlog.Check(cctx); err != nil {
			http.Error(w, "not ready: "+err.Error()+"\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("/status", statusHandler(statusReport{Version: version, Components: cfg.Components, PodBackend: podBackendOf(cfg)}, &isReady, warns))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	hln, err := net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		return fmt.Errorf("HTTP_LISTEN: %w", err)
	}
	g.Go(func() error {
		return serve(gctx, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, hln, false)
	})
	log.Info().Str("listen", hln.Addr().String()).Msg("health and metrics serving")

	err = g.Wait()
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
		FacadeURL: facadeURL, FacadeID: cfg.FacadeID, Renew: time.Duration(int(cfg.Lease.Seconds())/3) * time.Second,
		Labels: executor.Labels(assignment.BackendPod), RunnerBin: runnerBin, RunnerSHA256: cfg.GiteaRunnerSHA256,
		RunnerVersion: cfg.GiteaRunnerVersion, SpiffeEndpointSocket: cfg.SpiffeEndpointSocket, LogFormat: cfg.LogFormat,
	}.Environ()
}
