package vmworker_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/launcher"
	"github.com/dynrunner/dynrunner/vmworker"
)

func ip(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// TestEndpointServesOnlyTheBridge puts one network namespace on the microVM bridge and one
// outside it (routed to the host), and checks the nonce endpoint answers only the first.
func TestEndpointServesOnlyTheBridge(t *testing.T) {
	if testing.Short() {
		t.Skip("creates a bridge and network namespaces")
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs as root; this test needs it")
		}
		t.Skip("needs root for the bridge and network namespaces")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("needs curl inside the namespaces: apt-get install curl")
	}
	const (
		bridge = "drnonce0"
		nsIn   = "dr-nonce-in"
		nsOut  = "dr-nonce-out"
	)
	bridgeAddr := netip.MustParsePrefix("10.213.55.1/24")
	t.Cleanup(func() {
		for _, args := range [][]string{{"netns", "del", nsIn}, {"netns", "del", nsOut}, {"link", "del", bridge}, {"link", "del", "drout-h"}} {
			_ = exec.Command("ip", args...).Run()
		}
	})
	root := filepath.Join(t.TempDir(), "l")
	require.NoError(t, launcher.EnsureBridge(t.Context(), root, bridge, bridgeAddr))
	// On the bridge: a veth whose host end is a bridge port, like a guest's TAP device.
	ip(t, "netns", "add", nsIn)
	ip(t, "link", "add", "drin-h", "type", "veth", "peer", "name", "drin-g")
	ip(t, "link", "set", "drin-g", "netns", nsIn)
	ip(t, "link", "set", "drin-h", "master", bridge)
	ip(t, "link", "set", "drin-h", "up")
	ip(t, "-n", nsIn, "addr", "add", "10.213.55.10/24", "dev", "drin-g")
	ip(t, "-n", nsIn, "link", "set", "drin-g", "up")
	// Outside: a separate link to the host, routed, so packets for the bridge address arrive
	// at the host on another interface.
	ip(t, "netns", "add", nsOut)
	ip(t, "link", "add", "drout-h", "type", "veth", "peer", "name", "drout-g")
	ip(t, "link", "set", "drout-g", "netns", nsOut)
	ip(t, "addr", "add", "10.214.55.1/30", "dev", "drout-h")
	ip(t, "link", "set", "drout-h", "up")
	ip(t, "-n", nsOut, "addr", "add", "10.214.55.2/30", "dev", "drout-g")
	ip(t, "-n", nsOut, "link", "set", "drout-g", "up")
	ip(t, "-n", nsOut, "route", "add", "default", "via", "10.214.55.1")

	r := newRig(t)
	ln, err := net.Listen("tcp", "10.213.55.1:0")
	require.NoError(t, err)
	e, err := vmworker.NewEndpoint(vmworker.EndpointConfig{Listen: ln.Addr().String(), Allowed: bridgeAddr.Masked(), Log: zerolog.New(zerolog.NewTestWriter(t))}, r.nonces, r.log)
	require.NoError(t, err)
	srv := &http.Server{Handler: e.Handler()}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := fmt.Sprintf("http://%s/v1/ping", ln.Addr())

	status := func(ns string) string {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", url).Output()
		return strings.TrimSpace(string(out))
	}
	require.Equal(t, "200", status(nsIn), "from the bridge: HTTP status")
	require.NotEqual(t, "200", status(nsOut), "from outside the bridge: HTTP status, want refused")
}
