package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/local"
	"github.com/dynrunner/dynrunner/vmworker"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
)

// nonceTTL bounds how long an unredeemed nonce lives in JetStream.
const nonceTTL = time.Hour

// startVMWorker starts the nonce endpoint and the vm worker, whose environments are
// `dynrunner launcher` processes.
func startVMWorker(ctx, gctx context.Context, g *errgroup.Group, cfg config.Controller, log zerolog.Logger, actor string,
	issuer *captoken.Issuer, box *sealbox.Box, js jetstream.JetStream, evlog *eventlog.Log, view *eventlog.View,
	facadeSrc workload.Source, ready *[]<-chan struct{},
) error {
	vlog := log.With().Str("component", "vm-worker").Logger()
	nonces, err := vmworker.OpenNonces(ctx, js, box, cfg.NATSReplicas, nonceTTL)
	if err != nil {
		return err
	}
	facadeCA := func() ([]byte, error) {
		bundle, err := facadeSrc.GetX509BundleForTrustDomain(cfg.TrustDomain)
		if err != nil {
			return nil, fmt.Errorf("vm worker: facade CA: %w", err)
		}
		return bundle.Marshal()
	}
	if _, err := facadeCA(); err != nil {
		return err
	}
	ep, err := vmworker.NewEndpoint(vmworker.EndpointConfig{
		Listen: cfg.VM.NonceListen, Allowed: cfg.VM.GuestNet,
		FacadeURL: cfg.VM.FacadeGuestURL, FacadeID: cfg.FacadeID.String(), FacadeCA: facadeCA,
		RunnerBin: cfg.GiteaRunnerBin, RunnerSHA256: cfg.GiteaRunnerSHA256, RunnerVersion: cfg.GiteaRunnerVersion,
		Labels: []string{"self-hosted:host", "vm:host"}, Renew: cfg.Lease / 3, Log: vlog,
	}, nonces, evlog)
	if err != nil {
		return err
	}
	g.Go(func() error { return ep.Run(gctx) })
	vlog.Info().Str("listen", cfg.VM.NonceListen).Str("guests", cfg.VM.GuestNet.String()).Msg("nonce endpoint serving microVM guests")

	backend, err := vmBackend(cfg, vlog, nonces)
	if err != nil {
		return err
	}
	w := podworker.New(podworker.Config{
		Actor: "vm-worker@" + actor, Tier: assignment.BackendVM, Concurrency: cfg.VMConcurrency,
		Issuer: issuer, Log: vlog,
	}, backend, evlog, view)
	g.Go(func() error { return w.Run(gctx) })
	*ready = append(*ready, w.Ready())
	return nil
}

// vmBackend builds the vm worker's backend from VM_BACKEND.
func vmBackend(cfg config.Controller, vlog zerolog.Logger, nonces *vmworker.Nonces) (podworker.Backend, error) {
	if cfg.VM.Backend == "opensandbox" {
		o := cfg.VM.OpenSandbox
		key, err := secretfile.Read(o.APIKeyFile)
		if err != nil {
			return nil, fmt.Errorf("OPENSANDBOX_API_KEY_FILE: %w", err)
		}
		return opensandbox.New(opensandbox.Config{
			BaseURL: o.URL, APIKey: key, Pool: o.Pool, Image: o.Image, Scope: o.Scope, SandboxTTL: o.SandboxTTL,
			StartTimeout: o.StartTimeout, Timeout: o.RequestTimeout, Nonces: nonces, Endpoint: cfg.VM.NonceURL, Log: vlog,
		})
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("vm worker: locate the dynrunner binary: %w", err)
	}
	procs, err := local.New(local.Config{
		Root:    filepath.Join(cfg.StateDir, "launchers"),
		Command: []string{exe, "launcher"},
		BaseEnv: []string{"PATH=" + os.Getenv("PATH"), "LANG=C.UTF-8"},
		Grace:   30 * time.Second, // the launcher tears its VM down on SIGTERM
		Log:     vlog.With().Str("backend", "launcher").Logger(),
	})
	if err != nil {
		return nil, err
	}
	launch := map[string]string{
		"DYNRUNNER_LAUNCH_IMAGE":       cfg.VM.Image,
		"DYNRUNNER_LAUNCH_KERNEL":      cfg.VM.Kernel,
		"DYNRUNNER_LAUNCH_INITRAMFS":   cfg.VM.Initramfs,
		"DYNRUNNER_LAUNCH_CMDLINE":     cfg.VM.Cmdline,
		"DYNRUNNER_LAUNCH_FIRMWARE":    cfg.VM.Firmware,
		"DYNRUNNER_LAUNCH_HYPERVISOR":  cfg.VM.Hypervisor,
		"DYNRUNNER_LAUNCH_CPUS":        fmt.Sprint(cfg.VM.CPUs),
		"DYNRUNNER_LAUNCH_MEMORY_MIB":  fmt.Sprint(cfg.VM.MemoryMiB),
		"DYNRUNNER_LAUNCH_DISK_GIB":    fmt.Sprint(cfg.VM.DiskGiB),
		"DYNRUNNER_LAUNCH_BRIDGE":      cfg.VM.Bridge,
		"DYNRUNNER_LAUNCH_BRIDGE_CIDR": cfg.VM.BridgeCIDR.String(),
		"DYNRUNNER_LAUNCH_ROOT":        cfg.VM.LauncherRoot,
		"DYNRUNNER_LAUNCH_DEADLINE":    "6h",
	}
	return vmworker.NewBackend(procs, nonces, cfg.VM.NonceURL, launch), nil
}
