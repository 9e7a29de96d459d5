package launcher

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func testSeed(t *testing.T) seedData {
	t.Helper()
	id, _ := ParseInstanceID(testID)
	nonce, _ := ParseNonce(testNonce)
	ep, _ := ParseEndpoint("http://10.213.0.1:8080")
	return seedData{
		ID: id, Nonce: nonce, Endpoint: ep,
		MAC:     net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55},
		Addr:    netip.MustParsePrefix("10.213.0.17/24"),
		Gateway: netip.MustParseAddr("10.213.0.1"),
	}
}

func TestSeedContent(t *testing.T) {
	d := testSeed(t)
	wantMeta := `instance-id: "0b5e7d3a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
local-hostname: "dynrunner-0b5e7d3a"
dynrunner-nonce: "NONCE_abcdefghij-0123456789"
dynrunner-endpoint: "http://10.213.0.1:8080"
`
	if got := string(d.metaData()); got != wantMeta {
		t.Errorf("meta-data\n got %q\nwant %q", got, wantMeta)
	}
	wantNet := `version: 2
ethernets:
  eth0:
    match:
      macaddress: "02:11:22:33:44:55"
    set-name: eth0
    addresses:
      - "10.213.0.17/24"
    routes:
      - to: "0.0.0.0/0"
        via: "10.213.0.1"
`
	if got := string(d.networkConfig()); got != wantNet {
		t.Errorf("network-config\n got %q\nwant %q", got, wantNet)
	}
	d.DNS = []netip.Addr{netip.MustParseAddr("10.0.0.53"), netip.MustParseAddr("10.0.1.53")}
	wantNS := wantNet + `    nameservers:
      addresses:
        - "10.0.0.53"
        - "10.0.1.53"
`
	if got := string(d.networkConfig()); got != wantNS {
		t.Errorf("network-config with name servers\n got %q\nwant %q", got, wantNS)
	}
	user := string(d.userData())
	if !strings.HasPrefix(user, "#cloud-config\n") || strings.Contains(user, testNonce) || strings.Contains(strings.ToLower(user), "token:") {
		t.Errorf("user-data %q", user)
	}
}

func TestWriteSeedISO(t *testing.T) {
	if _, err := exec.LookPath("genisoimage"); err != nil {
		skipOrFail(t, "genisoimage is missing")
	}
	dir := t.TempDir()
	iso := filepath.Join(dir, seedFile)
	if err := writeSeed(context.Background(), dir, iso, testSeed(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "seed.d")); !os.IsNotExist(err) {
		t.Errorf("staging directory left behind: %v", err)
	}
	isoinfo, err := exec.LookPath("isoinfo")
	if err != nil {
		t.Skip("isoinfo (package genisoimage) is missing; the ISO was written but not inspected")
	}
	out, err := exec.Command(isoinfo, "-d", "-i", iso).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Volume id: cidata") {
		t.Fatalf("isoinfo -d: %v\n%s", err, out)
	}
	out, err = exec.Command(isoinfo, "-R", "-f", "-i", iso).CombinedOutput()
	if err != nil {
		t.Fatalf("isoinfo -f: %v\n%s", err, out)
	}
	files := strings.Fields(string(out))
	slices.Sort(files)
	if want := []string{"/meta-data", "/network-config", "/user-data"}; !slices.Equal(files, want) {
		t.Errorf("ISO holds %q, want exactly %q", files, want)
	}
	meta, err := exec.Command(isoinfo, "-R", "-x", "/meta-data", "-i", iso).Output()
	if err != nil || string(meta) != string(testSeed(t).metaData()) {
		t.Errorf("meta-data in the ISO: %q, %v", meta, err)
	}
}
