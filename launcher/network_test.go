package launcher

import (
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestMACAndTAP(t *testing.T) {
	id, err := ParseInstanceID(testID)
	if err != nil {
		t.Fatal(err)
	}
	mac := MAC(id)
	if len(mac) != 6 || mac[0]&0x02 == 0 || mac[0]&0x01 != 0 {
		t.Errorf("MAC %s: want a locally administered unicast address", mac)
	}
	if again := MAC(id); again.String() != mac.String() {
		t.Errorf("MAC not deterministic: %s, %s", mac, again)
	}
	other, _ := ParseInstanceID("0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5c")
	if MAC(other).String() == mac.String() {
		t.Errorf("two ids share MAC %s", mac)
	}
	if got, want := TAPName(id), "dr0b5e7d3a"; got != want {
		t.Errorf("TAPName = %q, want %q", got, want)
	}
	if got, want := Hostname(id), "dynrunner-0b5e7d3a"; got != want {
		t.Errorf("Hostname = %q, want %q", got, want)
	}
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
		if errs[i] != nil {
			t.Fatalf("allocation %d: %v", i, errs[i])
		}
		ip := got[i]
		if seen[ip] || !bridge.Contains(ip) || ip == bridge.Addr() || ip == endpoint ||
			ip == bridge.Masked().Addr() || ip == broadcast(bridge) {
			t.Fatalf("allocation %d: %s (duplicate or reserved)", i, ip)
		}
		seen[ip] = true
		owner, ok := leaseOwner(filepath.Join(root, leasesDir, ip.String()))
		if !ok || owner != ids[i] {
			t.Errorf("lease %s owned by %v", ip, owner)
		}
	}
	if _, err := allocateIP(root, ids[n], bridge, endpoint); err == nil {
		t.Fatal("allocation beyond the network succeeded")
	}
	if err := releaseIPs(root, ids[0]); err != nil {
		t.Fatal(err)
	}
	ip, err := allocateIP(root, ids[n], bridge, endpoint)
	if err != nil || ip != got[0] {
		t.Fatalf("after a release: %s, %v; want %s", ip, err, got[0])
	}
	entries, _ := os.ReadDir(filepath.Join(root, leasesDir))
	if len(entries) != n {
		t.Errorf("%d leases, want %d", len(entries), n)
	}
}

func TestBroadcast(t *testing.T) {
	for in, want := range map[string]string{"10.213.0.1/24": "10.213.0.255", "10.0.0.1/16": "10.0.255.255", "10.213.0.9/29": "10.213.0.15"} {
		if got := broadcast(netip.MustParsePrefix(in)).String(); got != want {
			t.Errorf("broadcast(%s) = %s, want %s", in, got, want)
		}
	}
}
