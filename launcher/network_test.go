package launcher

import (
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMACAndTAP(t *testing.T) {
	id, err := ParseInstanceID(testID)
	require.NoError(t, err)
	mac := MAC(id)
	require.Len(t, mac, 6)
	assert.True(t, mac[0]&0x02 != 0 && mac[0]&0x01 == 0, "MAC %s: want a locally administered unicast address", mac)
	assert.Equal(t, mac.String(), MAC(id).String(), "MAC not deterministic")
	other, err := ParseInstanceID("0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5c")
	require.NoError(t, err)
	assert.NotEqual(t, mac.String(), MAC(other).String(), "two ids share a MAC")
	assert.Equal(t, "dr0b5e7d3a", TAPName(id))
	assert.Equal(t, "dynrunner-0b5e7d3a", Hostname(id))
}

func TestAllocateIPConcurrent(t *testing.T) {
	root := t.TempDir()
	bridge := netip.MustParsePrefix("10.213.0.1/27") // 30 hosts, minus bridge and endpoint: 28
	endpoint := netip.MustParseAddr("10.213.0.2")
	const n = 28
	ids := make([]InstanceID, n+1)
	for i := range ids {
		ids[i] = InstanceID{b: [16]byte{0: 1, 12: byte(i % 3), 15: byte(i)}} // crowd a few start offsets
	}
	var wg sync.WaitGroup
	got := make([]netip.Addr, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { got[i], errs[i] = allocateIP(root, ids[i], bridge, endpoint) })
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for i := range n {
		require.NoError(t, errs[i], "allocation %d", i)
		ip := got[i]
		require.False(t, seen[ip] || !bridge.Contains(ip) || ip == bridge.Addr() || ip == endpoint ||
			ip == bridge.Masked().Addr() || ip == broadcast(bridge), "allocation %d: %s (duplicate or reserved)", i, ip)
		seen[ip] = true
		owner, ok := leaseOwner(filepath.Join(root, leasesDir, ip.String()))
		assert.True(t, ok, "lease %s has no owner", ip)
		assert.Equal(t, ids[i], owner, "owner of lease %s", ip)
	}
	_, err := allocateIP(root, ids[n], bridge, endpoint)
	require.Error(t, err, "allocation beyond the network succeeded")
	require.NoError(t, releaseIPs(root, ids[0]))
	ip, err := allocateIP(root, ids[n], bridge, endpoint)
	require.NoError(t, err, "after a release")
	assert.Equal(t, got[0], ip, "after a release")
	entries, err := os.ReadDir(filepath.Join(root, leasesDir))
	require.NoError(t, err)
	assert.Len(t, entries, n)
}

func TestBroadcast(t *testing.T) {
	for in, want := range map[string]string{"10.213.0.1/24": "10.213.0.255", "10.0.0.1/16": "10.0.255.255", "10.213.0.9/29": "10.213.0.15"} {
		assert.Equal(t, want, broadcast(netip.MustParsePrefix(in)).String(), "broadcast(%s)", in)
	}
}
