package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

// jobNetwork is the docker backend's network as the rest of the controller needs it: where job
// containers reach the facade, and whether the controller serves the facade on the network's
// gateway and firewalls it.
type jobNetwork struct {
	docker.Network
	// FacadeURL is what job containers dial (DYNRUNNER_FACADE_URL).
	FacadeURL string
	// GatewayListen, when set, is the extra address the facade listens on: the managed
	// network's gateway, at RUNNER_FACADE_LISTEN's port.
	GatewayListen string
}

// prepareJobNetwork creates or adopts the docker backend's job network and decides how its
// containers reach the facade. Warnings about what jobs reach go to warns.
func prepareJobNetwork(ctx context.Context, cfg config.Controller, b *docker.Backend, log zerolog.Logger, warns *bootWarnings) (jobNetwork, error) {
	n, err := b.PrepareNetwork(ctx, cfg.Docker.Subnet)
	if err != nil {
		return jobNetwork{}, fmt.Errorf("POD_DOCKER_NETWORK=%s: %w", cfg.Docker.Network, err)
	}
	jn, warnings, err := planJobNetwork(cfg, n)
	for _, w := range warnings {
		warns.warn(log, w)
	}
	return jn, err
}

// planJobNetwork decides, for network n, where job containers reach the facade, whether the
// facade listens on n's gateway, and what to warn the operator of.
func planJobNetwork(cfg config.Controller, n docker.Network) (jobNetwork, []string, error) {
	jn := jobNetwork{Network: n, FacadeURL: cfg.FacadeURL}
	loopback := config.LoopbackURLs(cfg.FacadeURL)
	switch {
	case n.Name == docker.HostNetwork:
		return jn, []string{"POD_DOCKER_NETWORK=host: job containers share this host's network and reach every service listening on its loopback, the event bus (NATS) and the controller's /metrics included; leave POD_DOCKER_NETWORK unset for an isolated network"}, nil
	case !n.Managed:
		if len(loopback) > 0 {
			return jobNetwork{}, nil, fmt.Errorf("RUNNER_FACADE_URL=%s: containers on network %s cannot reach a loopback facade (%s), and the network was not created by dynrunner, so the facade is not served on its gateway: give an address they reach (and RUNNER_FACADE_LISTEN on it), or let dynrunner create its own network", cfg.FacadeURL, n.Name, strings.Join(loopback, ", "))
		}
		return jn, []string{fmt.Sprintf("POD_DOCKER_NETWORK=%s is not a network dynrunner created: job containers reach whatever it lets them reach; dynrunner neither isolates nor firewalls it", n.Name)}, nil
	}
	if len(loopback) > 0 {
		// The controller serves its own facade here (config refuses a loopback facade URL
		// otherwise); the containers get the gateway's address in place of each loopback URL
		// of it. Another loopback facade (another port) is nothing they can reach.
		_, port, err := net.SplitHostPort(cfg.FacadeListen)
		if err != nil {
			return jobNetwork{}, nil, fmt.Errorf("RUNNER_FACADE_LISTEN: %w", err)
		}
		addr := net.JoinHostPort(n.Gateway.String(), port)
		urls, err := executor.ParseFacadeURLs(cfg.FacadeURL)
		if err != nil {
			return jobNetwork{}, nil, fmt.Errorf("RUNNER_FACADE_URL: %w", err)
		}
		for i, u := range urls {
			if !config.LoopbackURL(u) {
				continue
			}
			if _, p, _ := urlHostPort(u); p != port {
				return jobNetwork{}, nil, fmt.Errorf("RUNNER_FACADE_URL=%s: containers on network %s cannot reach the loopback facade %s: only this controller's own facade (RUNNER_FACADE_LISTEN=%s) is served on the network's gateway; give an address they reach", cfg.FacadeURL, n.Name, u, cfg.FacadeListen)
			}
			urls[i] = "https://" + addr
		}
		if urls, err = executor.ParseFacadeURLs(strings.Join(urls, ",")); err != nil {
			return jobNetwork{}, nil, fmt.Errorf("RUNNER_FACADE_URL: %w", err)
		}
		jn.FacadeURL = strings.Join(urls, ",")
		if !listensEverywhere(cfg.FacadeListen) {
			jn.GatewayListen = addr
		}
	}
	var warnings []string
	if config.LoopbackURL(cfg.GiteaURL) {
		warnings = append(warnings, fmt.Sprintf("GITEA_URL=%s is a loopback address, which job containers on the isolated network %s cannot reach: jobs check out from Gitea's ROOT_URL, so Gitea must listen on, and name in ROOT_URL, an address of this host or another they reach", cfg.GiteaURL, n.Name))
	}
	if cfg.GitHub.Slots() && config.LoopbackURL(cfg.GitHub.URL) {
		warnings = append(warnings, fmt.Sprintf("GITHUB_CONFIG_URL=%s is a loopback address, which the GitHub runners of job containers on the isolated network %s cannot reach: GitHub slots there will not get their jobs", cfg.GitHub.URL, n.Name))
	}
	return jn, warnings, nil
}

// firewall is what the managed network's containers may reach on this host: the facade they
// are given and the forges (a GitHub slot's runner talks to GITHUB_CONFIG_URL's host, a GitHub
// Enterprise Server that may run on this host), host names resolved now. Other hosts are not
// the firewall's business.
func (jn jobNetwork) firewall(ctx context.Context, cfg config.Controller) (docker.Firewall, error) {
	fw := docker.Firewall{Bridge: jn.Bridge}
	type target struct{ name, url string }
	var allow []target
	for u := range strings.SplitSeq(jn.FacadeURL, ",") {
		allow = append(allow, target{"the facade URL of job containers", u})
	}
	allow = append(allow, target{"GITEA_URL", cfg.GiteaURL})
	if cfg.GitHub.URL != "" {
		allow = append(allow, target{"GITHUB_CONFIG_URL", cfg.GitHub.URL})
	}
	for _, u := range allow {
		addrs, err := resolveURL(ctx, u.url)
		if err != nil {
			return fw, fmt.Errorf("job network firewall: %s %s: %w", u.name, u.url, err)
		}
		fw.Allow = append(fw.Allow, addrs...)
	}
	return fw, nil
}

// installFirewall installs the managed network's firewall and returns what withdraws it at
// shutdown; for other networks it does nothing.
func (jn jobNetwork) installFirewall(ctx context.Context, cfg config.Controller, log zerolog.Logger) (func(), error) {
	if !jn.Managed {
		return func() {}, nil
	}
	fw, err := jn.firewall(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := fw.Apply(ctx); err != nil {
		return nil, fmt.Errorf("POD_DOCKER_NETWORK=%s: %w (the controller needs root or CAP_NET_ADMIN and nft for the isolated job network; POD_DOCKER_NETWORK=host does without, at the price docs/deploy-docker.md names)", jn.Name, err)
	}
	allow := make([]string, len(fw.Allow))
	for i, a := range fw.Allow {
		allow[i] = a.String()
	}
	log.Info().Str("network", jn.Name).Str("bridge", jn.Bridge).Str("gateway", jn.Gateway.String()).Strs("allow", allow).
		Str("nft_table", "inet "+docker.FirewallTable(jn.Bridge)).Msg("job network firewall installed: from job containers the host accepts only these")
	return func() {
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := fw.Withdraw(wctx); err != nil {
			log.Warn().Err(err).Msg("withdraw from the job network's firewall")
		}
	}, nil
}

// resolveURL returns the IPv4 addresses and port of u's host; loopback addresses are left
// out, since no container on a bridge reaches them.
func resolveURL(ctx context.Context, raw string) ([]netip.AddrPort, error) {
	host, p, err := urlHostPort(raw)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("no port")
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if addrs, err = net.DefaultResolver.LookupNetIP(rctx, "ip4", host); err != nil {
			return nil, err
		}
	}
	var out []netip.AddrPort
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() && !a.IsLoopback() {
			out = append(out, netip.AddrPortFrom(a, uint16(port)))
		}
	}
	return out, nil
}

// urlHostPort returns the host of the URL raw and its port, the scheme's (http 80, https 443)
// when it names none.
func urlHostPort(raw string) (host, port string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", err
	}
	port = u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Hostname(), port, nil
}

// listensEverywhere reports whether a listen address is a wildcard, which covers the gateway.
func listensEverywhere(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsUnspecified()
}
