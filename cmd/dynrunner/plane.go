package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/forge"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/launcher"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/kube"
	"github.com/dynrunner/dynrunner/scheduler"
)

// plane is what the controller's components share, built once at boot, and the errgroup that
// runs them.
type plane struct {
	cfg config.Controller
	log zerolog.Logger
	// actor names this process in the records (see newActor).
	actor string

	issuer    *captoken.Issuer
	runnerKey []byte
	box       *sealbox.Box

	js    jetstream.JetStream
	evlog *eventlog.Log
	view  *eventlog.View

	reg           *prometheus.Registry
	metrics       *scheduler.Metrics
	facadeMetrics *facade.Metrics
	workerMetrics *podworker.Metrics

	// upstream is the forge, with the scheduler or the facade; nil otherwise.
	upstream forge.Forge
	warns    *bootWarnings
	// devCA is the development CA (DEV_CA), with the facade or the pod worker; nil otherwise.
	devCA *workload.DevCA
	// facadeSrc is the facade's SVID, with the facade; nil otherwise.
	facadeSrc workload.Source

	g    *errgroup.Group
	gctx context.Context
	// started is when the controller opened the plane, for the heartbeats.
	started time.Time
	// ready holds what each component closes once it is ready, in the order they started.
	ready []readyWait
	// cleanups run at exit, the last added first.
	cleanups []func()
	// workers are this process's pod and vm workers, for drains; stopping is set once a
	// SIGTERM drain began (DRAIN_SECS), so lifting a cordon does not undo it.
	workersMu sync.Mutex
	workers   []drainWorker
	stopping  atomic.Bool
}

// onExit has close run f.
func (p *plane) onExit(f func()) { p.cleanups = append(p.cleanups, f) }

// close runs the cleanups, the last added first, as deferred calls would.
func (p *plane) close() {
	for i := len(p.cleanups) - 1; i >= 0; i-- {
		p.cleanups[i]()
	}
}

// open prepares what every component shares: the state directory, the keys, the actor, NATS
// and JetStream, the metrics registry, the event log and the view, which follow starts feeding.
func (p *plane) open(ctx context.Context) error {
	cfg := p.cfg
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("STATE_DIR: %w", err)
	}
	issuer, runnerKey, box, recordKey, err := keys(cfg, p.log)
	if err != nil {
		return err
	}
	p.issuer, p.runnerKey, p.box = issuer, runnerKey, box
	if p.actor, err = newActor(); err != nil {
		return err
	}
	if err := p.connectNATS(); err != nil {
		return err
	}
	p.reg = prometheus.NewRegistry()
	p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p.metrics = scheduler.NewMetrics(p.reg)
	p.facadeMetrics = facade.NewMetrics(p.reg)
	p.workerMetrics = podworker.NewMetrics(p.reg)
	rejectedRecords := newRejectedRecords(p.reg)
	p.reg.MustRegister(fleet.NewAutoscaleCollector(p.fleet))

	elCfg := eventlog.DefaultConfig()
	elCfg.Replicas = cfg.NATSReplicas
	elCfg.Key = recordKey
	elCfg.OnReject = rejectionReporter(p.log, rejectedRecords)
	elCfg.OnIndexError = func(err error) {
		p.log.Warn().Err(err).Msg("could not keep the index of live assignments; the views repair it from the stream")
	}
	elCfg.NoncesTTL = nonceTTL
	elCfg.LeasesTTL = cfg.SchedulerLease
	elCfg.ComponentsTTL = cfg.LivenessTTL
	if p.evlog, err = openEventLog(ctx, p.js, elCfg, p.log); err != nil {
		return err
	}
	p.view = eventlog.NewView()
	p.g, p.gctx = errgroup.WithContext(ctx)
	p.started = time.Now().UTC()
	return nil
}

// heartbeat announces one of this process's components in the components bucket until the
// controller stops (package liveness); fill, when set, adds what its kind reports.
func (p *plane) heartbeat(kind string, fill func(*liveness.Record)) error {
	host, _ := os.Hostname()
	h, err := liveness.New(p.evlog.Components(), p.cfg.LivenessTTL, liveness.Record{
		Kind: kind, Instance: liveness.Instance(p.actor), Host: host, Version: version, StartedAt: p.started,
	}, fill, p.log.With().Str("component", kind).Logger())
	if err != nil {
		return err
	}
	p.g.Go(func() error { return h.Run(p.gctx) })
	return nil
}

// openTopologyWithin bounds how long a starting process waits for JetStream to create or
// find its streams and buckets: a process started together with its NATS cluster (or during a
// node's restart) waits for the cluster's meta leader and for the replicas' placement instead
// of exiting at the first timeout.
var openTopologyWithin = 2 * time.Minute

// openEventLog is eventlog.Open, retried with backoff while JetStream's answers are
// transient (timeouts, no responders, a cluster still placing replicas, a concurrent create by
// another process), for at most openTopologyWithin. Any other error fails the boot at once.
func openEventLog(ctx context.Context, js jetstream.JetStream, cfg eventlog.Config, log zerolog.Logger) (*eventlog.Log, error) {
	deadline := time.Now().Add(openTopologyWithin)
	wait := 250 * time.Millisecond
	for {
		l, err := eventlog.Open(ctx, js, cfg)
		if err == nil || !transientJetStream(err) || ctx.Err() != nil {
			return l, err
		}
		if time.Now().Add(wait).After(deadline) {
			return nil, fmt.Errorf("JetStream did not create or find dynrunner's streams and buckets within %s (is the cluster up, with a meta leader and enough nodes for NATS_REPLICAS?): %w", openTopologyWithin, err)
		}
		log.Warn().Err(err).Dur("retry_in", wait).Msg("JetStream not ready for dynrunner's streams and buckets yet; retrying")
		if err := clock.Sleep(ctx, wait); err != nil {
			return nil, err
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// transientJetStream reports whether a JetStream API error may go away by itself: a timeout,
// no responders, a server error (503: no meta leader yet), no peers to place replicas on yet,
// or a stream another process is creating at the same moment. A 500 is not: the server
// answers "replicas > 1 not supported in non-clustered mode" with it.
func transientJetStream(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, eventlog.ErrStalled) {
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.Code == 503 || api.ErrorCode == jetstream.JSErrCodeStreamNameInUse ||
			api.ErrorCode == jsErrInsufficientResources || api.ErrorCode == jsErrNoSuitablePeers
	}
	return false
}

// JetStream error codes the jetstream package names no constant for.
const (
	jsErrInsufficientResources jetstream.ErrorCode = 10023
	jsErrNoSuitablePeers       jetstream.ErrorCode = 10005
)

// nonceTTL bounds how long an unredeemed nonce lives in JetStream.
const nonceTTL = time.Hour

// follow feeds the view from the event log. The components subscribe to the view when they
// are built (eventlog.View.OnChange), so it runs once every component is: a view is
// subscribed before it is fed.
func (p *plane) follow() {
	p.g.Go(func() error { return watchEventLog(p.gctx, p.evlog, p.view, p.log) })
	p.ready = append(p.ready, readyWait{"the view (loading the live assignments from JetStream)", p.view.Ready()})
}

// watchEventLog runs Watch, and runs it again after an error JetStream may get over by itself
// (a stream whose replicas have no leader yet, a node killed or cut off mid-read): the view
// folds each record once by its sequence, so reading again from the index's tail loses and
// repeats nothing. Any other error stops the process.
func watchEventLog(ctx context.Context, l *eventlog.Log, v *eventlog.View, log zerolog.Logger) error {
	wait := 250 * time.Millisecond
	for {
		err := l.Watch(ctx, v)
		if err == nil || ctx.Err() != nil || !transientJetStream(err) {
			return err
		}
		log.Warn().Err(err).Dur("retry_in", wait).Msg("following the event log failed; reading it again")
		if clock.Sleep(ctx, wait) != nil {
			return nil //nolint:nilerr // stopped while waiting: a shutdown, not a failure
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// newActor names the process in the records and, for the pod and vm workers, in the liveness
// bucket, where two processes must never share one: containers may share a hostname and a pid
// (1), so a random instance suffix makes it unique.
func newActor() (string, error) {
	host, _ := os.Hostname()
	var inst [3]byte
	if _, err := rand.Read(inst[:]); err != nil {
		return "", fmt.Errorf("instance id: %w", err)
	}
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), inst), nil
}

// connectNATS connects to NATS (starting the embedded server when configured so) and JetStream;
// the connection closes at exit.
func (p *plane) connectNATS() error {
	natsCfg, err := natsConfig(p.cfg, p.actor)
	if err != nil {
		return err
	}
	nc, err := natsconn.Connect(natsCfg)
	if err != nil {
		return err
	}
	p.onExit(nc.Close)
	if p.cfg.Embedded() {
		p.log.Info().Str("store", natsCfg.StoreDir).Str("listen", natsCfg.Listen).Msg("embedded nats-server with JetStream started")
	}
	if p.js, err = jetstream.New(nc.NC); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	return nil
}

// natsConfig is the controller's NATS connection: the embedded server's operator with its
// generated password, or NATS_URL's user with NATS_PASSWORD_FILE.
func natsConfig(cfg config.Controller, actor string) (natsconn.Config, error) {
	natsCfg := natsconn.Config{URL: cfg.NATSURL, User: cfg.NATSUser, StoreDir: filepath.Join(cfg.StateDir, "jetstream"), Name: "dynrunner-controller " + actor}
	if cfg.Embedded() && cfg.NATSEmbedListen != "" {
		pw, _, err := secretfile.LoadOrCreate(filepath.Join(cfg.StateDir, embeddedPasswordFile), 24)
		if err != nil {
			return natsCfg, fmt.Errorf("embedded NATS password: %w", err)
		}
		natsCfg.Listen, natsCfg.User, natsCfg.Password = cfg.NATSEmbedListen, embeddedUser, string(pw)
	}
	if cfg.NATSPasswordFile != "" {
		pw, err := secretfile.Read(cfg.NATSPasswordFile)
		if err != nil {
			return natsCfg, fmt.Errorf("NATS_PASSWORD_FILE: %w", err)
		}
		natsCfg.Password = string(pw)
	}
	return natsCfg, nil
}

// declareRunner connects to the forge as the resident runner, for the scheduler or the facade.
func (p *plane) declareRunner(ctx context.Context) error {
	if !p.cfg.Has(config.Scheduler) && !p.cfg.Has(config.Facade) {
		return nil
	}
	// Every tier label is declared whether or not its tier is enabled here, so Gitea hands
	// a job for a disabled tier to the scheduler, which fails it with a clear message
	// instead of leaving it queued; and every process declares the same labels.
	labels := []string{scheduler.LabelSelfHosted, string(assignment.BackendPod), string(assignment.BackendVM)}
	g, err := connectForge(ctx, p.cfg, labels)
	if err != nil {
		return err
	}
	p.upstream = g
	p.log.Info().Str("gitea", p.cfg.GiteaURL).Strs("labels", labels).Msg("resident runner declared")
	return nil
}

// loadDevCA loads or creates the development CA with DEV_CA, for the facade or the pod worker.
func (p *plane) loadDevCA() error {
	cfg := p.cfg
	if !cfg.DevCA || (!cfg.Has(config.Facade) && !cfg.Has(config.PodWorker)) {
		return nil
	}
	var err error
	if p.devCA, err = workload.LoadOrCreateDevCA(filepath.Join(cfg.StateDir, "ca"), cfg.TrustDomain); err != nil {
		return err
	}
	p.warns.warn(p.log.With().Str("ca", filepath.Join(cfg.StateDir, "ca")).Logger(), "DEVELOPMENT ONLY: SPIFFE_ENDPOINT_SOCKET is unset, so a built-in CA issues the SVIDs of the facade and of local environments; production uses SPIRE")
	return nil
}

// podTier builds the pod worker's backend, with the pod worker; the zero podTier otherwise.
func (p *plane) podTier(ctx context.Context) (podTier, error) {
	if !p.cfg.Has(config.PodWorker) {
		return podTier{}, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return podTier{}, fmt.Errorf("pod worker: locate the dynrunner binary: %w", err)
	}
	plog := p.log.With().Str("component", "pod-worker").Str("backend", p.cfg.PodBackend).Logger()
	return newPodTier(ctx, p.cfg, exe, plog, p.warns, kube.RecordPhases(p.evlog, "pod-worker@"+p.actor, time.Now, plog))
}

// startScheduler starts the scheduler and its heartbeat.
func (p *plane) startScheduler() error {
	cfg := p.cfg
	var capacityOf func() (map[assignment.Backend]int, bool)
	if cfg.AdmitCapacity == config.CapacityWorkers {
		wc := &fleet.CapacityFollower{JS: p.js, Every: time.Second, Stale: cfg.LivenessTTL}
		p.g.Go(func() error { return wc.Run(p.gctx) })
		capacityOf = wc.Get
	}
	s := scheduler.New(scheduler.Config{
		Actor: "scheduler@" + p.actor, Backends: tierBackends(cfg), Lease: cfg.Lease, Pickup: cfg.Pickup,
		Capacity:      map[assignment.Backend]int{assignment.BackendPod: cfg.PodConcurrency, assignment.BackendVM: cfg.VMConcurrency},
		CapacityOf:    capacityOf,
		Admission:     cfg.Admission,
		FetchInterval: cfg.FetchInterval, FetchIntervalMax: 10 * cfg.FetchInterval, Keepalive: cfg.Keepalive,
		Reconcile: time.Second, ForgeURL: assignment.ForgeURL(cfg.GiteaURL), Grants: cfg.Grants, Box: p.box, Log: p.log.With().Str("component", "scheduler").Logger(), Metrics: p.metrics,
	}, p.upstream, p.evlog, p.view)
	p.g.Go(func() error { return s.Run(p.gctx) })
	p.ready = append(p.ready, readyWait{"the scheduler (a first successful fetch from the forge, or a tier found full so that it does not fetch; with ADMIT_CAPACITY=workers, a first reading of the workers' heartbeats)", s.Ready()})
	p.g.Go(func() error { return p.sweepCordons(s.LeaseHeld) })
	if cfg.GitHub.Enabled() {
		if err := p.startGitHub(); err != nil {
			return err
		}
	}
	if cfg.Autoscale.Backend == "docker" {
		if err := p.startActuator(p.gctx, s.LeaseHeld); err != nil {
			return err
		}
	}
	return p.heartbeat(liveness.KindScheduler, func(r *liveness.Record) { r.Scheduler.ReconcileLease = s.LeaseHeld() })
}

// tierBackends are the backends of the enabled tiers (TIERS).
func tierBackends(cfg config.Controller) []assignment.Backend {
	var backends []assignment.Backend
	for _, t := range cfg.Tiers {
		backends = append(backends, assignment.Backend(t))
	}
	return backends
}

// startFacade obtains the facade's SVID and serves the facade: to environments at
// RUNNER_FACADE_LISTEN, to job containers on the job network's gateway when jobNet says so,
// and to microVM guests with the vm worker.
func (p *plane) startFacade(ctx context.Context, jobNet jobNetwork) error {
	cfg := p.cfg
	if err := p.facadeSource(ctx, jobNet); err != nil {
		return err
	}
	f := facade.New(facade.Config{
		Actor: "facade@" + p.actor, TrustDomain: cfg.TrustDomain, Lease: cfg.Lease, Issuer: p.issuer,
		RunnerKey: p.runnerKey, Box: p.box, Log: p.log.With().Str("component", "facade").Logger(), Metrics: p.facadeMetrics,
	}, p.upstream, p.evlog, p.view)
	ln, err := net.Listen("tcp", cfg.FacadeListen)
	if err != nil {
		return fmt.Errorf("RUNNER_FACADE_LISTEN: %w", err)
	}
	srv := f.Server(f.Handler(), workload.ServerTLSConfig(p.facadeSrc))
	facadeReady := make(chan struct{})
	close(facadeReady)
	p.ready = append(p.ready, readyWait{"the facade", facadeReady})
	p.g.Go(func() error { return serve(p.gctx, srv, ln, true) })
	p.log.Info().Str("listen", ln.Addr().String()).Str("spiffe_id", cfg.FacadeID.String()).Msg("facade serving mTLS")
	if addr := jobNet.GatewayListen; addr != "" {
		jln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("facade on the job network's gateway: %w", err)
		}
		jsrv := f.Server(f.Handler(), workload.ServerTLSConfig(p.facadeSrc))
		p.g.Go(func() error { return serve(p.gctx, jsrv, jln, true) })
		p.log.Info().Str("listen", jln.Addr().String()).Str("network", jobNet.Name).Msg("facade serving mTLS to job containers")
	}
	if err := p.heartbeat(liveness.KindFacade, func(r *liveness.Record) { r.Facade.URL = cfg.FacadeURL }); err != nil {
		return err
	}
	if cfg.Has(config.VMWorker) {
		return p.serveFacadeToGuests(ctx, f)
	}
	return nil
}

// facadeSource obtains the facade's SVID, from the development CA (for every name the facade
// is dialled by) or the SPIFFE Workload API; it closes at exit.
func (p *plane) facadeSource(ctx context.Context, jobNet jobNetwork) error {
	cfg := p.cfg
	var err error
	if p.devCA != nil {
		hosts := facadeHosts(cfg.FacadeURL)
		if cfg.Has(config.VMWorker) {
			hosts = append(hosts, facadeHosts(cfg.VM.FacadeGuestURL)...)
		}
		if jobNet.Managed {
			hosts = append(hosts, jobNet.Gateway.String())
		}
		p.facadeSrc, err = p.devCA.ServerSource(cfg.FacadeID, 24*time.Hour, hosts)
	} else {
		p.facadeSrc, err = workload.FromWorkloadAPI(ctx, cfg.SpiffeEndpointSocket)
	}
	if err != nil {
		return fmt.Errorf("facade SVID: %w", err)
	}
	p.onExit(func() { p.facadeSrc.Close() })
	return nil
}

// serveFacadeToGuests serves the facade's guest listener to microVM guests; with the local vm
// backend it first sets up the bridge and the guests' firewall, removed at exit.
func (p *plane) serveFacadeToGuests(ctx context.Context, f *facade.Facade) error {
	cfg := p.cfg
	if cfg.VM.Backend == "local" {
		if err := launcher.EnsureBridge(ctx, cfg.VM.LauncherRoot, cfg.VM.Bridge, cfg.VM.BridgeCIDR); err != nil {
			return err
		}
		if err := applyVMFirewall(ctx, cfg, p.log); err != nil {
			return err
		}
		p.onExit(func() { removeVMFirewall(cfg, p.log) })
	}
	gln, err := net.Listen("tcp", cfg.VM.FacadeGuestListen)
	if err != nil {
		return fmt.Errorf("RUNNER_FACADE_GUEST_LISTEN: %w", err)
	}
	gsrv := f.Server(onlyFrom(cfg.VM.GuestNet, f.GuestHandler()), workload.GuestServerTLSConfig(p.facadeSrc))
	p.g.Go(func() error { return serve(p.gctx, gsrv, gln, true) })
	p.log.Info().Str("listen", gln.Addr().String()).Msg("facade serving microVM guests (token-authenticated TLS, vm assignments only)")
	return nil
}

// startPodWorker starts the pod worker on the pod tier's backend, and its heartbeat.
func (p *plane) startPodWorker(pods podTier) error {
	cfg := p.cfg
	var ident podworker.Identity
	if p.devCA != nil {
		ident = devIdentity{ca: p.devCA}
	}
	w := podworker.New(podworker.Config{
		Actor: "pod-worker@" + p.actor, Tier: assignment.BackendPod, Concurrency: cfg.PodConcurrency,
		Issuer: p.issuer, Identity: ident, Log: p.log.With().Str("component", "pod-worker").Logger(),
		ExecutorEnv: executorEnv(cfg, pods.facadeURL, pods.runnerBin), Grants: cfg.Grants, Metrics: p.workerMetrics,
		GitHub: p.gitHubWorker(),
	}, pods.backend, p.evlog, p.view)
	p.g.Go(func() error { return w.Run(p.gctx) })
	p.ready = append(p.ready, readyWait{"the pod worker (recovering its environments, then consuming dispatches)", w.Ready()})
	p.followCordon(liveness.KindPodWorker, w)
	return p.heartbeat(liveness.KindPodWorker, workerLoad(w, cfg.PodConcurrency))
}

// workerLoad is the heartbeat's fill of a pod or vm worker: its capacity, what it has in
// flight, and whether it drains.
func workerLoad(w *podworker.Worker, capacity int) func(*liveness.Record) {
	return func(r *liveness.Record) {
		// Draining first: a worker that drains starts nothing new, so an InFlight read after
		// it can only be too high, never too low (safe_to_remove is never early).
		r.Worker.Draining = w.Draining()
		r.Worker.Capacity, r.Worker.InFlight = capacity, w.InFlight()
	}
}

// serveHTTP serves health, readiness, status and metrics at HTTP_LISTEN, and marks the
// controller ready once every component is.
func (p *plane) serveHTTP() error {
	var isReady atomic.Bool
	p.g.Go(func() error { return p.awaitReady(&isReady) })
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.Handle("/readyz", readyHandler(&isReady, p.unready, p.evlog))
	mux.Handle("/status", statusHandler(statusReport{Version: version, Components: p.cfg.Components, PodBackend: podBackendOf(p.cfg)}, &isReady, p.warns, p.fleet))
	mux.Handle("GET /v1/fleet/autoscale", fleet.AutoscaleHandler(p.fleet))
	mux.Handle("/v1/workers/", p.drainAPI())
	mux.Handle("/metrics", promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{}))
	hln, err := net.Listen("tcp", p.cfg.HTTPListen)
	if err != nil {
		return fmt.Errorf("HTTP_LISTEN: %w", err)
	}
	p.g.Go(func() error {
		return serve(p.gctx, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, hln, false)
	})
	p.log.Info().Str("listen", hln.Addr().String()).Msg("health and metrics serving")
	return nil
}

// fleet reads the deployment's fleet for /status: the components alive from the components
// bucket, the live work from this controller's view.
func (p *plane) fleet(ctx context.Context) (fleet.Report, error) {
	components, rejected, err := fleet.ReadComponents(ctx, p.js)
	if err != nil {
		return fleet.Report{}, err
	}
	r := fleet.Build(components, p.view.Live(), time.Now().UTC())
	r.Rejected = rejected
	r.Autoscale = r.Decisions(perWorker(p.cfg.Tiers, p.cfg.PodConcurrency, p.cfg.VMConcurrency))
	return r, nil
}

// perWorker is the capacity of one worker of each tier in tiers, as configured: the autoscaling
// decision's capacity of a new worker while none of its tier is online.
func perWorker(tiers []string, pod, vm int) map[assignment.Backend]int {
	out := map[assignment.Backend]int{}
	for _, t := range tiers {
		switch assignment.Backend(t) {
		case assignment.BackendPod:
			out[assignment.BackendPod] = pod
		case assignment.BackendVM:
			out[assignment.BackendVM] = vm
		}
	}
	return out
}

// readyWait is one component's readiness: what it is, for /readyz and the log, and what it
// closes once ready.
type readyWait struct {
	what string
	c    <-chan struct{}
}

// unready names the components not ready yet.
func (p *plane) unready() []string {
	var out []string
	for _, r := range p.ready {
		select {
		case <-r.c:
		default:
			out = append(out, r.what)
		}
	}
	return out
}

// readyLogEvery is how often a controller that is not ready yet logs what it waits for.
const readyLogEvery = 30 * time.Second

// awaitReady waits for every component to be ready, then sets isReady. While it waits, it
// logs every readyLogEvery what it still waits for.
func (p *plane) awaitReady(isReady *atomic.Bool) error {
	t := time.NewTicker(readyLogEvery)
	defer t.Stop()
	for _, r := range p.ready {
	wait:
		for {
			select {
			case <-r.c:
				break wait
			case <-t.C:
				p.log.Info().Strs("waiting_for", p.unready()).Msg("controller not ready yet")
			case <-p.gctx.Done():
				return nil
			}
		}
	}
	isReady.Store(true)
	p.log.Info().Strs("components", p.cfg.Components).Msg("controller ready")
	return nil
}

// readyHandler answers /readyz: ready once isReady is set and the event log's streams and
// buckets are usable. Until then it names what it waits for (unready).
func readyHandler(isReady *atomic.Bool, unready func() []string, evlog *eventlog.Log) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isReady.Load() {
			http.Error(w, "not ready: waiting for "+strings.Join(unready(), "; "), http.StatusServiceUnavailable)
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
}
