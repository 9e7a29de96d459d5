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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	assert.Equal(t, wantMeta, string(d.metaData()))
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
	assert.Equal(t, wantNet, string(d.networkConfig()))
	d.DNS = []netip.Addr{netip.MustParseAddr("10.0.0.53"), netip.MustParseAddr("10.0.1.53")}
	wantNS := wantNet + `    nameservers:
      addresses:
        - "10.0.0.53"
        - "10.0.1.53"
`
	assert.Equal(t, wantNS, string(d.networkConfig()), "network-config with name servers")
	user := string(d.userData())
	assert.True(t, strings.HasPrefix(user, "#cloud-config\n"), "user-data %q", user)
	assert.NotContains(t, user, testNonce)
	assert.NotContains(t, strings.ToLower(user), "token:")
}

func TestWriteSeedISO(t *testing.T) {
	if _, err := exec.LookPath("genisoimage"); err != nil {
		skipOrFail(t, "genisoimage is missing")
	}
	dir := t.TempDir()
	iso := filepath.Join(dir, seedFile)
	require.NoError(t, writeSeed(context.Background(), dir, iso, testSeed(t)))
	_, err := os.Stat(filepath.Join(dir, "seed.d"))
	assert.ErrorIs(t, err, os.ErrNotExist, "staging directory left behind")
	isoinfo, err := exec.LookPath("isoinfo")
	if err != nil {
		t.Skip("isoinfo (package genisoimage) is missing; the ISO was written but not inspected")
	}
	out, err := exec.Command(isoinfo, "-d", "-i", iso).CombinedOutput()
	require.NoError(t, err, "isoinfo -d: %s", out)
	require.Contains(t, string(out), "Volume id: cidata")
	out, err = exec.Command(isoinfo, "-R", "-f", "-i", iso).CombinedOutput()
	require.NoError(t, err, "isoinfo -f: %s", out)
	files := strings.Fields(string(out))
	slices.Sort(files)
	assert.Equal(t, []string{"/meta-data", "/network-config", "/user-data"}, files)
	meta, err := exec.Command(isoinfo, "-R", "-x", "/meta-data", "-i", iso).Output()
	require.NoError(t, err)
	assert.Equal(t, string(testSeed(t).metaData()), string(meta), "meta-data in the ISO")
}
