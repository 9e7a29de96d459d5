package docker_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/podworker/docker"
)

// TestIsolatedNetwork: the network the backend creates is an isolated bridge, adopted again
// on the next boot; with its firewall, a job container reaches the one allowed port of the
// host and is refused every other (here a second listener on the same address, as the
// embedded NATS server or the metrics would be), and it cannot reach another job's container.
func TestIsolatedNetwork(t *testing.T) {
	image := testImage(t)
	state := t.TempDir()
	name := "drt-" + testScope(t)
	b := newBackend(t, image, state, testScope(t), func(c *docker.Config) { c.Network = name })
	ctx := ctxT(t)

	n, err := b.PrepareNetwork(ctx, netip.Prefix{})
	require.NoError(t, err)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		assert.NoError(t, docker.RemoveFirewall(cctx, n.Bridge))
		assert.NoError(t, b.RemoveNetwork(cctx))
	})
	assert.True(t, n.Managed, "created by the backend: managed")
	assert.True(t, n.Subnet.Contains(n.Gateway), "gateway %s in %s", n.Gateway, n.Subnet)
	var inspected struct {
		Options map[string]string `json:"Options"`
		Labels  map[string]string `json:"Labels"`
	}
	code, err := engineJSON(ctx, http.MethodGet, "/networks/"+name, nil, &inspected)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "false", inspected.Options["com.docker.network.bridge.enable_icc"], "containers must not reach each other")
	assert.Equal(t, "true", inspected.Labels[docker.LabelManaged])

	again, err := b.PrepareNetwork(ctx, netip.Prefix{})
	require.NoError(t, err)
	assert.Equal(t, n, again, "a second boot adopts the network")

	listen := func() net.Listener {
		ln, err := net.Listen("tcp4", net.JoinHostPort(n.Gateway.String(), "0"))
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		return ln
	}
	facade, other := listen(), listen()
	fw := docker.Firewall{Bridge: n.Bridge, Allow: []netip.AddrPort{facade.Addr().(*net.TCPAddr).AddrPort()}}
	require.NoError(t, fw.Apply(ctx))

	// Another job's container, listening.
	peer := startT(t, b, fakeSpec(51, "listen"))
	var peerInfo struct {
		NetworkSettings struct {
			Networks map[string]struct {
				IPAddress string `json:"IPAddress"`
			} `json:"Networks"`
		} `json:"NetworkSettings"`
	}
	_, err = engineJSON(ctx, http.MethodGet, "/containers/"+peer.Data["container_id"]+"/json", nil, &peerInfo)
	require.NoError(t, err)
	peerIP := peerInfo.NetworkSettings.Networks[name].IPAddress
	require.NotEmpty(t, peerIP, "the peer's address on %s", name)

	spec := fakeSpec(52, "dial")
	spec.Env["DYNRUNNER_TEST_REACH"] = facade.Addr().String()
	spec.Env["DYNRUNNER_TEST_REFUSE"] = fmt.Sprintf("%s,%s", other.Addr(), net.JoinHostPort(peerIP, strconv.Itoa(9000)))
	h := startT(t, b, spec)
	exit := waitT(t, b, h)
	if exit.Code != 0 {
		diag, _ := b.Diagnose(ctx, h)
		t.Fatalf("inside the job container: %+v: %s", exit, diag)
	}
	require.NoError(t, b.Destroy(ctx, peer))

	require.NoError(t, fw.Withdraw(ctx))
	require.NoError(t, fw.Withdraw(ctx), "withdrawing twice")
}
