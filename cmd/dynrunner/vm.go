package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/liveness"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/launcher"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/local"
	"github.com/dynrunner/dynrunner/vmworker"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
)

// startVMWorker starts the nonce endpoint and the vm worker, whose environments are
// `dynrunner launcher` processes.
func startVMWorker(ctx context.Context, p *plane) error {
	cfg := p.cfg
	vlog := p.log.With().Str("component", "vm-worker").Logger()
	nonces := vmworker.NewNonces(p.evlog.Nonces(), p.box)
	facadeCA := func() ([]byte, error) {
		bundle, err := p.facadeSrc.GetX509BundleForTrustDomain(cfg.TrustDomain)
		if err != nil {
			return nil, fmt.Errorf("vm worker: facade CA: %w", err)
		}
		return bundle.Marshal()
	}
	if _, err := facadeCA(); err != nil {
		return err
	}
	gh := p.gitHubVMWorker()
	var ghGrant executor.GitHubConfig
	if gh != nil {
		ghGrant = executor.GitHubConfig{RunnerBin: gh.Env.RunnerBin, RunnerSHA256: gh.Env.RunnerSHA256}
	}
	ep, err := vmworker.NewEndpoint(vmworker.EndpointConfig{
		Listen: cfg.VM.NonceListen, Allowed: cfg.VM.GuestNet, FacadeCA: facadeCA, Log: vlog,
		Executor: executor.Config{
			FacadeURL: cfg.VM.FacadeGuestURL, FacadeID: cfg.FacadeID,
			RunnerBin: cfg.GiteaRunnerBin, RunnerSHA256: cfg.GiteaRunnerSHA256, RunnerVersion: cfg.GiteaRunnerVersion,
			Labels: executor.Labels(assignment.BackendVM), Renew: assignment.RenewEvery(cfg.Lease),
		},
		GitHub: ghGrant,
	}, nonces, p.evlog)
	if err != nil {
		return err
	}
	p.g.Go(func() error { return ep.Run(p.gctx) })
	vlog.Info().Str("listen", cfg.VM.NonceListen).Str("guests", cfg.VM.GuestNet.String()).Msg("nonce endpoint serving microVM guests")

	backend, err := vmBackend(cfg, vlog, nonces)
	if err != nil {
		return err
	}
	w := podworker.New(podworker.Config{
		Actor: "vm-worker@" + p.actor, Tier: assignment.BackendVM, Concurrency: cfg.VMConcurrency,
		Issuer: p.issuer, Log: vlog, Grants: cfg.Grants, Metrics: p.workerMetrics, GitHub: gh,
	}, backend, p.evlog, p.view)
	p.g.Go(func() error { return w.Run(p.gctx) })
	p.ready = append(p.ready, readyWait{"the vm worker (recovering its environments, then consuming dispatches)", w.Ready()})
	p.followCordon(liveness.KindVMWorker, w)
	return p.heartbeat(liveness.KindVMWorker, workerLoad(w, cfg.VMConcurrency))
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
	// PATH is passed through to the launchers, not configuration: no parser reads it.
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
	b, err := vmworker.NewBackend(procs, nonces, cfg.VM.NonceURL, launchEnv(cfg))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// launchEnv is the launcher settings of every microVM, as the environment of its launcher
// (launcher.Config.Environ); the vm worker adds each one's instance, nonce and endpoint.
func launchEnv(cfg config.Controller) map[string]string {
	return launcher.Config{
		Image: cfg.VM.Image, Kernel: cfg.VM.Kernel, Initramfs: cfg.VM.Initramfs, Cmdline: cfg.VM.Cmdline,
		Firmware: cfg.VM.Firmware, Hypervisor: cfg.VM.Hypervisor,
		CPUs: cfg.VM.CPUs, MemoryMiB: cfg.VM.MemoryMiB, DiskGiB: cfg.VM.DiskGiB,
		Bridge: cfg.VM.Bridge, BridgeCIDR: cfg.VM.BridgeCIDR, DNS: cfg.VM.DNS,
		Root: cfg.VM.LauncherRoot, Deadline: launcher.DefaultDeadline,
	}.Environ()
}

// vmFirewall is what the guests on the bridge may reach: on the host, the nonce endpoint and
// the facade's guest listener; with VM_EGRESS=nat also the forge (GITEA_URL's host and port),
// the name servers (VM_DNS, port 53) and VM_EGRESS_ALLOW, host names resolved now.
func vmFirewall(ctx context.Context, cfg config.Controller) (launcher.Firewall, error) {
	fw := launcher.Firewall{Bridge: cfg.VM.Bridge, BridgeCIDR: cfg.VM.BridgeCIDR, Mode: cfg.VM.Egress}
	for _, listen := range []string{cfg.VM.NonceListen, cfg.VM.FacadeGuestListen} {
		ap, err := netip.ParseAddrPort(listen)
		if err != nil {
			return fw, fmt.Errorf("vm firewall: %s: %w", listen, err)
		}
		fw.HostPorts = append(fw.HostPorts, ap.Port())
	}
	if cfg.VM.Egress != launcher.EgressNAT {
		return fw, nil
	}
	host, port, err := urlHostPort(cfg.GiteaURL)
	if err != nil {
		return fw, fmt.Errorf("vm firewall: GITEA_URL: %w", err)
	}
	list := net.JoinHostPort(host, port)
	for _, a := range cfg.VM.DNS {
		list += "," + net.JoinHostPort(a.String(), "53")
	}
	if cfg.VM.EgressAllow != "" {
		list += "," + cfg.VM.EgressAllow
	}
	named := false
	resolve := func(ctx context.Context, host string) ([]netip.Addr, error) {
		named = true
		return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
	}
	if fw.Allow, err = launcher.ParseDestinations(ctx, list, resolve); err != nil {
		return fw, fmt.Errorf("VM_EGRESS=nat: %w", err)
	}
	if named && len(cfg.VM.DNS) == 0 {
		return fw, errors.New("VM_EGRESS=nat: the forge or a VM_EGRESS_ALLOW entry is a host name, but guests have no name server: set VM_DNS")
	}
	return fw, nil
}

// applyVMFirewall installs the guests' firewall before any guest boots.
func applyVMFirewall(ctx context.Context, cfg config.Controller, log zerolog.Logger) error {
	fw, err := vmFirewall(ctx, cfg)
	if err != nil {
		return err
	}
	on, err := launcher.ApplyFirewall(ctx, fw)
	if err != nil {
		return err
	}
	if on {
		log.Warn().Msg("VM_EGRESS=nat turned on IPv4 forwarding (net.ipv4.ip_forward=1) on this host; the guests' firewall filters what the bridge forwards")
	}
	allow := make([]string, len(fw.Allow))
	for i, d := range fw.Allow {
		allow[i] = d.String()
	}
	log.Info().Str("bridge", fw.Bridge).Str("egress", fw.Mode).Strs("allow", allow).Str("nft_table", "inet "+launcher.Table(fw.Bridge)).
		Msg("microVM guests' firewall installed")
	return nil
}

// removeVMFirewall removes the guests' firewall at shutdown, unless microVMs still run: they
// outlive the controller, and their firewall with them.
func removeVMFirewall(cfg config.Controller, log zerolog.Logger) {
	if entries, err := os.ReadDir(cfg.VM.LauncherRoot); err == nil {
		for _, e := range entries {
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				log.Info().Str("bridge", cfg.VM.Bridge).Msg("microVMs still run: their firewall stays")
				return
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := launcher.RemoveFirewall(ctx, cfg.VM.Bridge); err != nil {
		log.Warn().Err(err).Msg("remove the microVM guests' firewall")
	}
}
