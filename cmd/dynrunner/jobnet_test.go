package main

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

func TestPlanJobNetwork(t *testing.T) {
	managed := docker.Network{Name: "dynrunner", Managed: true, Bridge: "br-0123456789ab",
		Subnet: netip.MustParsePrefix("172.30.0.0/24"), Gateway: netip.MustParseAddr("172.30.0.1")}
	mine := docker.Network{Name: "ci-net", Bridge: "br-ba9876543210", Subnet: managed.Subnet, Gateway: managed.Gateway}
	host := docker.Network{Name: "host"}
	for _, tt := range []struct {
		name                  string
		listen, url, gitea    string
		github                config.GitHub
		n                     docker.Network
		wantURL, wantListen   string
		wantWarnings, wantErr bool
	}{
		{name: "managed, loopback facade: served on the gateway", listen: "127.0.0.1:8443", url: "https://127.0.0.1:8443", gitea: "https://gitea.example",
			n: managed, wantURL: "https://172.30.0.1:8443", wantListen: "172.30.0.1:8443"},
		{name: "managed, facade on every address: no second listener", listen: "0.0.0.0:8443", url: "https://127.0.0.1:8443", gitea: "https://gitea.example",
			n: managed, wantURL: "https://172.30.0.1:8443"},
		{name: "managed, facade elsewhere", listen: "127.0.0.1:8443", url: "https://facade.example:8443", gitea: "https://gitea.example",
			n: managed, wantURL: "https://facade.example:8443"},
		{name: "managed, loopback forge: warned", listen: "127.0.0.1:8443", url: "https://127.0.0.1:8443", gitea: "http://127.0.0.1:3000",
			n: managed, wantURL: "https://172.30.0.1:8443", wantListen: "172.30.0.1:8443", wantWarnings: true},
		{name: "managed, loopback GitHub with slots: warned", listen: "127.0.0.1:8443", url: "https://127.0.0.1:8443", gitea: "https://gitea.example",
			github: config.GitHub{URL: "http://127.0.0.1:8080/acme", RunnerBin: "/usr/local/bin/github-runner"},
			n:      managed, wantURL: "https://172.30.0.1:8443", wantListen: "172.30.0.1:8443", wantWarnings: true},
		{name: "managed, GitHub on the gateway: not warned", listen: "127.0.0.1:8443", url: "https://127.0.0.1:8443", gitea: "https://gitea.example",
			github: config.GitHub{URL: "https://172.30.0.1:8080/acme", RunnerBin: "/usr/local/bin/github-runner"},
			n:      managed, wantURL: "https://172.30.0.1:8443", wantListen: "172.30.0.1:8443"},
		{name: "host: warned", listen: "127.0.0.1:8443", url: "https://127.0.0.1:8443", gitea: "http://127.0.0.1:3000",
			n: host, wantURL: "https://127.0.0.1:8443", wantWarnings: true},
		{name: "an operator's network with a routable facade: warned", listen: "172.30.0.1:8443", url: "https://172.30.0.1:8443", gitea: "https://gitea.example",
			n: mine, wantURL: "https://172.30.0.1:8443", wantWarnings: true},
		{name: "an operator's network with a loopback facade: refused", listen: "127.0.0.1:8443", url: "https://127.0.0.1:8443", gitea: "https://gitea.example",
			n: mine, wantErr: true},
		{name: "managed, a list with this loopback facade: the gateway in its place", listen: "127.0.0.1:8443", url: "https://facade-b.example:8443,https://localhost:8443", gitea: "https://gitea.example",
			n: managed, wantURL: "https://facade-b.example:8443,https://172.30.0.1:8443", wantListen: "172.30.0.1:8443"},
		{name: "managed, a list with another loopback facade: refused", listen: "127.0.0.1:8443", url: "https://127.0.0.1:8443,https://127.0.0.1:9443", gitea: "https://gitea.example",
			n: managed, wantErr: true},
		{name: "an operator's network with a loopback facade in the list: refused", listen: "172.30.0.1:8443", url: "https://172.30.0.1:8443,https://127.0.0.1:8443", gitea: "https://gitea.example",
			n: mine, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Controller{FacadeListen: tt.listen, FacadeURL: tt.url, GiteaURL: tt.gitea, GitHub: tt.github}
			jn, warnings, err := planJobNetwork(cfg, tt.n)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantURL, jn.FacadeURL)
			assert.Equal(t, tt.wantListen, jn.GatewayListen)
			assert.Equal(t, tt.wantWarnings, len(warnings) > 0, "warnings %q", warnings)
		})
	}
}

func TestJobNetworkFirewall(t *testing.T) {
	jn := jobNetwork{Network: docker.Network{Name: "dynrunner", Managed: true, Bridge: "br-0123456789ab"}, FacadeURL: "https://172.30.0.1:8443"}
	fw, err := jn.firewall(t.Context(), config.Controller{GiteaURL: "http://10.215.0.2:3000"})
	require.NoError(t, err)
	assert.Equal(t, "br-0123456789ab", fw.Bridge)
	assert.Equal(t, []netip.AddrPort{netip.MustParseAddrPort("172.30.0.1:8443"), netip.MustParseAddrPort("10.215.0.2:3000")}, fw.Allow)

	// Every facade of a list is allowed.
	two := jn
	two.FacadeURL = "https://172.30.0.1:8443,https://10.215.0.3:8443"
	fw, err = two.firewall(t.Context(), config.Controller{GiteaURL: "http://10.215.0.2:3000"})
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{netip.MustParseAddrPort("172.30.0.1:8443"), netip.MustParseAddrPort("10.215.0.3:8443"), netip.MustParseAddrPort("10.215.0.2:3000")}, fw.Allow)

	// A GitHub Enterprise Server (or the fake) on this host is allowed for the slots' runners.
	fw, err = jn.firewall(t.Context(), config.Controller{GiteaURL: "http://10.215.0.2:3000", GitHub: config.GitHub{URL: "https://172.30.0.1:9443/acme"}})
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{netip.MustParseAddrPort("172.30.0.1:8443"), netip.MustParseAddrPort("10.215.0.2:3000"), netip.MustParseAddrPort("172.30.0.1:9443")}, fw.Allow)

	// A loopback forge is nothing a bridge reaches: not allowed.
	fw, err = jn.firewall(t.Context(), config.Controller{GiteaURL: "http://127.0.0.1:3000"})
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{netip.MustParseAddrPort("172.30.0.1:8443")}, fw.Allow)
	fw, err = jn.firewall(t.Context(), config.Controller{GiteaURL: "https://[::1]"})
	require.NoError(t, err)
	assert.Len(t, fw.Allow, 1)
}
