package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/kubernetes"

	"github.com/dynrunner/dynrunner/identity"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

// runIdentity runs the SPIRE registrar of job Pods or containers (`dynrunner identity`).
func runIdentity(ctx context.Context, args []string, getenv func(string) string) error {
	if len(args) > 0 {
		return fmt.Errorf("takes no arguments (configuration comes from the environment; see docs/configuration.md)")
	}
	cfg, err := config.LoadIdentity(getenv)
	if err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	log, err := newLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel, "identity")
	if err != nil {
		return err
	}
	rcfg := identity.Config{
		Source: identity.Source(cfg.Source), Namespace: cfg.Namespace,
		TrustDomain: cfg.TrustDomain, ParentID: cfg.ParentID, Selectors: identity.Selectors(cfg.Selectors),
		SVIDTTL: cfg.SVIDTTL, Resync: cfg.Resync, Log: log,
	}
	closeSource, err := registrarSource(cfg, &rcfg)
	if err != nil {
		return err
	}
	defer closeSource()
	// The SPIRE server's admin socket is local: a unix socket whose peers the server trusts as
	// admins (no TLS on it).
	conn, err := grpc.NewClient("unix://"+cfg.ServerSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("spire server admin socket %s: %w", cfg.ServerSocket, err)
	}
	defer func() { _ = conn.Close() }()
	rcfg.Entries = entryv1.NewEntryClient(conn)
	if err := registrarSelectors(cfg, &rcfg); err != nil {
		return err
	}
	reg, err := identity.New(rcfg)
	if err != nil {
		return err
	}
	mux := registrarMux(reg)
	hln, err := net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		return fmt.Errorf("HTTP_LISTEN: %w", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return reg.Run(gctx) })
	g.Go(func() error {
		return serve(gctx, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, hln, false)
	})
	log.Info().Str("listen", hln.Addr().String()).Str("spire_server_socket", cfg.ServerSocket).Msg("identity registrar started")
	err = g.Wait()
	created, deleted := reg.Stats()
	log.Info().Int64("entries_created", created).Int64("entries_deleted", deleted).Msg("identity registrar stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// registrarSource gives rcfg where it finds the workloads: the docker engine's containers, or
// the cluster's Pods (KUBECONFIG, or in-cluster). It returns what closes it at exit.
func registrarSource(cfg config.Identity, rcfg *identity.Config) (func(), error) {
	if rcfg.Source == identity.SourceDocker {
		inv, err := docker.NewInventory(cfg.DockerSocket, cfg.DockerScope)
		if err != nil {
			return nil, err
		}
		rcfg.Docker = inv
		return func() { _ = inv.Close() }, nil
	}
	rc, err := kubeRESTConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	if rcfg.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return func() {}, nil
}

// registrarSelectors gives rcfg the node alias and the facade's entry, when configured.
func registrarSelectors(cfg config.Identity, rcfg *identity.Config) error {
	if len(cfg.NodeAliasSelectors) > 0 {
		sel, err := identity.ParseSelectors(cfg.NodeAliasSelectors)
		if err != nil {
			return fmt.Errorf("IDENTITY_NODE_ALIAS_SELECTORS: %w", err)
		}
		rcfg.NodeAlias = &identity.NodeAlias{Selectors: sel}
	}
	if len(cfg.FacadeSelectors) == 0 {
		return nil
	}
	sel, err := identity.ParseSelectors(cfg.FacadeSelectors)
	if err != nil {
		return fmt.Errorf("IDENTITY_FACADE_SELECTORS: %w", err)
	}
	rcfg.FacadeSelectors, rcfg.FacadeID = sel, cfg.FacadeID
	if len(cfg.FacadeNodeSelectors) > 0 {
		nodes, err := identity.ParseSelectors(cfg.FacadeNodeSelectors)
		if err != nil {
			return fmt.Errorf("IDENTITY_FACADE_NODE_SELECTORS: %w", err)
		}
		rcfg.FacadeParent = &identity.FacadeParent{ID: cfg.FacadeParentID, Selectors: nodes}
	}
	return nil
}

// registrarMux serves the registrar's metrics, health and readiness (a reconciliation has
// succeeded).
func registrarMux(reg *identity.Registrar) http.Handler {
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "dynrunner_identity_entries_created_total", Help: "SPIRE entries the registrar created."},
			func() float64 { c, _ := reg.Stats(); return float64(c) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "dynrunner_identity_entries_deleted_total", Help: "SPIRE entries the registrar deleted (Pods ended, stale entries swept)."},
			func() float64 { _, d := reg.Stats(); return float64(d) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dynrunner_identity_ready", Help: "1 once a reconciliation has succeeded."},
			func() float64 {
				if reg.Ready() {
					return 1
				}
				return 0
			}),
	)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !reg.Ready() {
			http.Error(w, "not ready: no reconciliation has succeeded yet\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}
