package launcher_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/testbed/netnstest"
	"github.com/dynrunner/dynrunner/launcher"
)

func TestParseDestinations(t *testing.T) {
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "gitea.example.com":
			return []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")}, nil
		case "v6only.example.com":
			return []netip.Addr{netip.MustParseAddr("2001:db8::8")}, nil
		}
		return nil, fmt.Errorf("no such host %s", host)
	}
	for _, tc := range []struct {
		name, list string
		want       []string
		err        string
	}{
		{"address and port", "10.0.0.2:3000", []string{"10.0.0.2:3000"}, ""},
		{"network, every port", "10.1.0.0/16", []string{"10.1.0.0/16"}, ""},
		{"network with a port, spaces, empty entries", " 10.1.2.3/24:443 ,, 10.0.0.9 ", []string{"10.1.2.0/24:443", "10.0.0.9"}, ""},
		{"host name", "gitea.example.com:443", []string{"192.0.2.7:443"}, ""},
		{"empty", "", nil, ""},
		{"IPv6", "[2001:db8::1]:443", nil, "IPv4 only"},
		{"IPv6 network", "2001:db8::/32", nil, "IPv4 only"},
		{"port zero", "10.0.0.2:0", nil, "port must be 1 to 65535"},
		{"port out of range", "10.0.0.2:70000", nil, "port must be 1 to 65535"},
		{"not a name", "a_b$:80", nil, "want IPV4"},
		{"unknown name", "nowhere.example.com", nil, "no such host"},
		{"a name without IPv4", "v6only.example.com:443", nil, "no IPv4 address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := launcher.ParseDestinations(t.Context(), tc.list, resolve)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			var s []string
			for _, d := range got {
				s = append(s, d.String())
			}
			assert.Equal(t, tc.want, s)
		})
	}
}

func TestFirewallRuleset(t *testing.T) {
	fw := launcher.Firewall{Bridge: "dynrunner0", BridgeCIDR: netip.MustParsePrefix("10.213.0.1/24"), HostPorts: []uint16{8444, 7001}, Mode: launcher.EgressNone}
	none, err := fw.Ruleset()
	require.NoError(t, err)
	assert.Contains(t, none, "add table inet dynrunner_dynrunner0\ndelete table inet dynrunner_dynrunner0\n", "replaces the table in one transaction")
	assert.Contains(t, none, "ip daddr 10.213.0.1 tcp dport { 7001, 8444 } accept")
	assert.Contains(t, none, "meta l4proto tcp reject with tcp reset")
	assert.NotContains(t, none, "masquerade", "no NAT without egress")
	assert.NotContains(t, none, "@allowed")

	fw.Mode = launcher.EgressNAT
	fw.Allow = []launcher.Destination{
		{Net: netip.MustParsePrefix("10.0.0.2/32"), Port: 3000},
		{Net: netip.MustParsePrefix("10.9.0.0/16")},
	}
	nat, err := fw.Ruleset()
	require.NoError(t, err)
	for _, want := range []string{
		"10.0.0.2/32 . tcp . 3000-3000,", "10.0.0.2/32 . udp . 3000-3000,", "10.9.0.0/16 . tcp . 1-65535,",
		"ip daddr . meta l4proto . th dport @allowed accept",
		`ip saddr 10.213.0.0/24 oifname != "dynrunner0" masquerade`,
		`oifname "dynrunner0" drop`,
	} {
		assert.Contains(t, nat, want)
	}

	for name, bad := range map[string]launcher.Firewall{
		"bridge name":   {Bridge: `br"0; flush ruleset`, BridgeCIDR: fw.BridgeCIDR, HostPorts: fw.HostPorts, Mode: launcher.EgressNone},
		"mode":          {Bridge: "dynrunner0", BridgeCIDR: fw.BridgeCIDR, HostPorts: fw.HostPorts, Mode: "open"},
		"no host ports": {Bridge: "dynrunner0", BridgeCIDR: fw.BridgeCIDR, Mode: launcher.EgressNone},
	} {
		_, err := bad.Ruleset()
		assert.Error(t, err, name)
	}
}

// serve answers every connection on ln with name and closes it.
func serve(ln net.Listener, name string) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name))
			_ = c.Close()
		}
	}()
}

// reach dials addr from the guest and returns what the server said, or the error.
func reach(g *netnstest.Host, addr string) (string, error) {
	c, err := g.Dial(addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 64)
	n, err := c.Read(b)
	if n > 0 {
		return string(b[:n]), nil
	}
	return "", err
}

// TestFirewallFromAGuest plays a microVM guest on the bridge (a network namespace attached like
// a TAP device) against the firewall the controller installs: it reaches the host's guest ports
// and, with NAT, the allowed forge, and is refused everything else: other ports of the host,
// another port of the forge's host, and a host not on the list. Every listener is the test's
// own, in namespaces the test created.
func TestFirewallFromAGuest(t *testing.T) {
	netnstest.Need(t)
	_, err := exec.LookPath("nft")
	require.NoError(t, err, "nft is missing: bash scripts/vm-deps.sh")
	var b [1]byte
	_, _ = rand.Read(b[:])
	bridge := fmt.Sprintf("drfw%02x", b[0])
	cidr := netip.MustParsePrefix(fmt.Sprintf("10.216.%d.1/24", b[0]))
	t.Cleanup(func() {
		_ = launcher.RemoveFirewall(context.Background(), bridge)
		_ = exec.Command("ip", "link", "del", bridge).Run()
	})
	require.NoError(t, launcher.EnsureBridge(t.Context(), filepath.Join(t.TempDir(), "root"), bridge, cidr))

	guest := netnstest.NewOnBridge(t, bridge, netip.PrefixFrom(cidr.Addr().Next().Next(), cidr.Bits()), cidr.Addr())
	forge, other := netnstest.New(t), netnstest.New(t)
	serve(forge.Listen(t, 3000), "forge")
	serve(forge.Listen(t, 3001), "forge's other port")
	serve(other.Listen(t, 3000), "other")
	hostLn := func(name string) string {
		ln, err := net.Listen("tcp4", cidr.Addr().String()+":0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		serve(ln, name)
		return ln.Addr().String()
	}
	nonce, facade, elsewhere := hostLn("nonce"), hostLn("facade"), hostLn("elsewhere on the host")
	port := func(addr string) uint16 {
		ap := netip.MustParseAddrPort(addr)
		return ap.Port()
	}
	fw := launcher.Firewall{Bridge: bridge, BridgeCIDR: cidr, HostPorts: []uint16{port(nonce), port(facade)}, Mode: launcher.EgressNone}
	forgeAddr := forge.Addr.String() + ":3000"

	check := func(t *testing.T, addr, want string) {
		t.Helper()
		got, err := reach(guest, addr)
		if want == "" {
			require.Error(t, err, "the guest reached %s (%q)", addr, got)
			assert.True(t, strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "unreachable") || strings.Contains(err.Error(), "prohibited"),
				"refused at once, not left to time out: %v", err)
			return
		}
		require.NoError(t, err, "the guest could not reach %s", addr)
		assert.Equal(t, want, got)
	}

	t.Run("none", func(t *testing.T) {
		_, err := launcher.ApplyFirewall(t.Context(), fw)
		require.NoError(t, err)
		check(t, nonce, "nonce")
		check(t, facade, "facade")
		check(t, elsewhere, "")
		check(t, forgeAddr, "")
	})
	t.Run("nat", func(t *testing.T) {
		fw.Mode = launcher.EgressNAT
		fw.Allow = []launcher.Destination{{Net: netip.PrefixFrom(forge.Addr, 32), Port: 3000}}
		_, err := launcher.ApplyFirewall(t.Context(), fw)
		require.NoError(t, err)
		check(t, forgeAddr, "forge")
		check(t, forge.Addr.String()+":3001", "")
		check(t, other.Addr.String()+":3000", "")
		check(t, elsewhere, "")
		check(t, nonce, "nonce")
	})
	t.Run("removed", func(t *testing.T) {
		require.NoError(t, launcher.RemoveFirewall(t.Context(), bridge))
		require.NoError(t, launcher.RemoveFirewall(t.Context(), bridge), "idempotent")
		out, err := exec.Command("nft", "list", "table", "inet", launcher.Table(bridge)).CombinedOutput()
		assert.Error(t, err, "the table is gone: %s", out)
	})
}

// FuzzParseDestinations: an accepted allow list holds IPv4 networks only, each in its masked
// form, and printing it and parsing that again gives the same list.
func FuzzParseDestinations(f *testing.F) {
	for _, s := range []string{"10.0.0.2:3000", "10.1.0.0/16,10.0.0.9", "[::1]:80", "10.0.0.2:0", "a,b,,c:1", "10.1.2.3/24:443"} {
		f.Add(s)
	}
	noDNS := func(context.Context, string) ([]netip.Addr, error) { return nil, fmt.Errorf("no resolver") }
	f.Fuzz(func(t *testing.T, list string) {
		got, err := launcher.ParseDestinations(context.Background(), list, noDNS)
		if err != nil {
			return
		}
		var printed []string
		for _, d := range got {
			require.True(t, d.Net.Addr().Is4(), "%q gave %v", list, d)
			require.Equal(t, d.Net.Masked(), d.Net, "%q gave %v", list, d)
			printed = append(printed, d.String())
		}
		again, err := launcher.ParseDestinations(context.Background(), strings.Join(printed, ","), noDNS)
		require.NoError(t, err, "%q gave %v", list, got)
		require.Len(t, again, len(got), "%q gave %v, which parses to %v", list, got, again)
		for i := range got {
			require.Equal(t, got[i], again[i], "%q", list)
		}
	})
}
