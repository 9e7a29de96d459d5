package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/forge/github"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/podworker"
)

// gitHubTiers are the tiers GitHub slots are served on, one scale set each: every enabled
// tier. A pod slot's environment runs GitHub's runner (GITHUB_RUNNER_BIN), a vm slot's guest the
// runner of its image (GITHUB_VM_RUNNER_BIN).
func gitHubTiers(tiers []assignment.Backend) []assignment.Backend {
	var out []assignment.Backend
	for _, t := range tiers {
		if t == assignment.BackendPod || t == assignment.BackendVM {
			out = append(out, t)
		}
	}
	return out
}

// startGitHub starts the GitHub forge in a scheduler process (GITHUB_CONFIG_URL): the clients,
// the reruns of jobs whose environment was lost, then, in the background until GitHub
// answers, the scale sets and one session with its slots per scale set. Credentials that cannot be read refuse the boot; GitHub being unreachable
// does not: Gitea's jobs go on meanwhile.
func (p *plane) startGitHub() error {
	gh := p.cfg.GitHub
	var roots *x509.CertPool
	if gh.CAFile != "" {
		pem, err := secretfile.Read(gh.CAFile)
		if err != nil {
			return fmt.Errorf("GITHUB_CA_FILE: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("GITHUB_CA_FILE %s holds no PEM certificate", gh.CAFile)
		}
	}
	log := p.log.With().Str("component", "github").Logger()
	metrics := github.NewMetrics(p.reg)
	clients, err := github.NewClients(github.ClientsConfig{URL: gh.URL, Auth: gh.Auth, RootCAs: roots,
		Version: version, Log: log, Metrics: metrics})
	if err != nil {
		return err
	}
	actor := "scheduler@" + p.actor
	capacity := func(tier assignment.Backend) int {
		if tier == assignment.BackendVM {
			return p.cfg.VMConcurrency
		}
		return p.cfg.PodConcurrency
	}
	// Every replica follows the reruns; one claims each call in JetStream.
	reruns := github.NewReruns(github.RerunsConfig{KV: p.evlog.GitHubReruns(), Events: p.evlog, Clients: clients,
		Max: gh.Reruns, Actor: actor, Log: log, Metrics: metrics})
	p.g.Go(func() error { return reruns.Run(p.gctx) })
	slots := github.NewSlots(github.SlotsConfig{Events: p.evlog, View: p.view, Box: p.box, Actor: actor,
		Capacity: capacity, Pickup: gh.Idle, Lease: gh.JobLease, Reruns: reruns, Metrics: metrics, Log: log})
	want := github.ScaleSets{Prefix: gh.ScaleSetPrefix, RunnerGroup: gh.RunnerGroup, Tiers: gitHubTiers(tierBackends(p.cfg))}
	p.g.Go(func() error {
		sets, ok := ensureScaleSets(p.gctx, clients, want, log)
		if !ok {
			return nil // stopping
		}
		for _, set := range sets {
			s := github.NewSession(github.SessionConfig{Set: set, Clients: clients, Leases: p.evlog.Leases(),
				TTL: p.evlog.Config().LeasesTTL, Holder: actor, Capacity: func() int { return capacity(set.Tier) },
				Handler: slots, Log: log, Metrics: metrics})
			p.g.Go(func() error { return s.Run(p.gctx) })
		}
		return nil
	})
	return nil
}

// ensureScaleSets creates or adopts the scale sets, trying again every 10 s until GitHub
// answers; false when ctx ended first.
func ensureScaleSets(ctx context.Context, clients *github.Clients, want github.ScaleSets, log zerolog.Logger) ([]github.ScaleSet, bool) {
	for {
		sets, err := github.EnsureScaleSets(ctx, clients.Client(), want)
		if err == nil {
			return sets, true
		}
		log.Warn().Err(err).Msg("github: the scale sets; trying again in 10s")
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(10 * time.Second):
		}
	}
}

// gitHubWorker configures a pod worker for GitHub slots; nil without the runner's pin
// (GITHUB_RUNNER_BIN): the worker then refuses slots.
func (p *plane) gitHubWorker() *podworker.GitHub {
	gh := p.cfg.GitHub
	return p.gitHubSlots(gh.Slots(), gh.RunnerBin, gh.RunnerSHA256)
}

// gitHubVMWorker configures the vm worker for GitHub slots; nil without the pin of the runner
// in the guest image (GITHUB_VM_RUNNER_SHA256, by default GITHUB_RUNNER_SHA256): the worker
// then refuses slots. Its Env is also what the nonce endpoint grants the guests.
func (p *plane) gitHubVMWorker() *podworker.GitHub {
	gh := p.cfg.GitHub
	return p.gitHubSlots(gh.VMSlots(), gh.VMRunnerBin, gh.VMRunnerSHA256)
}

// gitHubSlots is a worker's GitHub configuration running the runner bin pinned by sha; nil
// when the worker serves no slots.
func (p *plane) gitHubSlots(serve bool, bin, sha string) *podworker.GitHub {
	if !serve {
		return nil
	}
	return &podworker.GitHub{Box: p.box,
		Env: executor.GitHubConfig{RunnerBin: bin, RunnerSHA256: sha, LogFormat: p.cfg.LogFormat}}
}
