package docker

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFirewallRuleset(t *testing.T) {
	f := Firewall{Bridge: "br-0123456789ab", Allow: []netip.AddrPort{
		netip.MustParseAddrPort("172.30.0.1:8443"), netip.MustParseAddrPort("10.0.0.7:3000"), netip.MustParseAddrPort("172.30.0.1:8443"),
	}}
	got, err := f.Ruleset()
	require.NoError(t, err)
	for _, want := range []string{
		"add table inet dynrunner_br_0123456789ab\n",
		"flush chain inet dynrunner_br_0123456789ab from_jobs\n",
		`input iifname "br-0123456789ab" jump from_jobs` + "\n",
		"from_jobs ct state established,related accept\n",
		"from_jobs ip daddr . tcp dport @allowed accept\n",
		"from_jobs meta l4proto tcp reject with tcp reset\n",
		"from_jobs reject with icmpx type admin-prohibited\n",
		"add element inet dynrunner_br_0123456789ab allowed { 10.0.0.7 . 3000, 172.30.0.1 . 8443 }\n",
	} {
		assert.Contains(t, got, want)
	}
	assert.Less(t, strings.Index(got, "accept\n"), strings.Index(got, "reject"), "accepts come before the refusals")

	none, err := Firewall{Bridge: "br-0123456789ab"}.Ruleset()
	require.NoError(t, err)
	assert.NotContains(t, none, "add element", "nothing allowed: the rules alone, refusing everything")

	for _, bad := range []Firewall{
		{Bridge: `br" ; flush ruleset ; "`},
		{Bridge: "a-bridge-name-too-long"},
		{Bridge: ""},
		{Bridge: "br-0", Allow: []netip.AddrPort{netip.MustParseAddrPort("[fd00::1]:80")}},
		{Bridge: "br-0", Allow: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:0")}},
	} {
		_, err := bad.Ruleset()
		assert.Error(t, err, "%+v", bad)
	}
}
