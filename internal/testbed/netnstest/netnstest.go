// Package netnstest gives integration tests hosts of their own: network namespaces joined to
// the test's namespace by a veth pair, each with an address the test's processes reach by a
// route, not by loopback — another machine, as far as routing, proxies and firewalls can tell.
// Creating them needs root (CI runs as root); New skips the test otherwise, and fails it in CI.
// Everything New creates is removed when the test ends.
package netnstest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Host is a network namespace with one address, routed from the test's namespace.
type Host struct {
	// Name is the namespace's name (`ip netns exec Name ...`).
	Name string
	// Addr is the namespace's address; Gateway the test namespace's end of the link.
	Addr, Gateway netip.Addr
	bits          int
	link          string
}

var seq atomic.Uint32

// Need skips (or in CI fails) the test when it cannot create namespaces.
func Need(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("creates network namespaces; run without -short")
	}
	msg := ""
	if os.Geteuid() != 0 {
		msg = "needs root to create network namespaces (ip netns add)"
	} else if _, err := exec.LookPath("ip"); err != nil {
		msg = "needs ip (iproute2): bash scripts/vm-deps.sh"
	}
	if msg == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// New creates a host: a namespace with a /30 link to the test's namespace, a default route
// back through it, and loopback up.
func New(t testing.TB) *Host {
	t.Helper()
	Need(t)
	var b [2]byte
	_, _ = rand.Read(b[:])
	// 10.215.0.0/16 in /30 links; the random part keeps parallel test binaries apart.
	base := netip.AddrFrom4([4]byte{10, 215, b[0], b[1] &^ 3})
	gw := base.Next()
	if out, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output(); strings.Contains(string(out), " "+gw.String()+"/") {
		t.Fatalf("netnstest: %s is in use; run again", gw)
	}
	h := newHost(t, netip.PrefixFrom(gw.Next(), 30), gw)
	h.setUp(t, []string{"addr", "add", gw.String() + "/30", "dev", h.link})
	return h
}

// NewOnBridge creates a host attached to bridge like a microVM's TAP device: the host's end of
// its veth is a port of the bridge, the namespace has addr (with the bridge's prefix) and a
// default route via gateway, the bridge's own address.
func NewOnBridge(t testing.TB, bridge string, addr netip.Prefix, gateway netip.Addr) *Host {
	t.Helper()
	Need(t)
	h := newHost(t, addr, gateway)
	h.setUp(t, []string{"link", "set", h.link, "master", bridge})
	return h
}

// newHost names a host with addr (and its prefix) and gateway; it is removed when the test ends.
func newHost(t testing.TB, addr netip.Prefix, gateway netip.Addr) *Host {
	var b [2]byte
	_, _ = rand.Read(b[:])
	id := fmt.Sprintf("%d%02x%02x", seq.Add(1)%100, b[0], b[1])
	h := &Host{Name: "drt-" + id, link: "drt" + id, Gateway: gateway, Addr: addr.Addr(), bits: addr.Bits()}
	t.Cleanup(h.remove)
	return h
}

// setUp creates the namespace and its veth pair; attach is the ip command that connects the
// test namespace's end (an address on it, or a bridge port).
func (h *Host) setUp(t testing.TB, attach []string) {
	t.Helper()
	for _, args := range [][]string{
		{"netns", "add", h.Name},
		{"link", "add", h.link, "type", "veth", "peer", "name", h.link + "n"},
		{"link", "set", h.link + "n", "netns", h.Name},
		attach,
		{"link", "set", h.link, "up"},
		{"-n", h.Name, "link", "set", "lo", "up"},
		{"-n", h.Name, "addr", "add", netip.PrefixFrom(h.Addr, h.bits).String(), "dev", h.link + "n"},
		{"-n", h.Name, "link", "set", h.link + "n", "up"},
		{"-n", h.Name, "route", "add", "default", "via", h.Gateway.String()},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("netnstest: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
}

// in runs fn with the calling goroutine's thread inside the host's namespace. Sockets fn
// creates stay in the namespace.
func (h *Host) in(fn func() error) error {
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return err
	}
	defer own.Close()
	ns, err := os.Open("/var/run/netns/" + h.Name)
	if err != nil {
		return err
	}
	defer ns.Close()
	errc := make(chan error, 1)
	// On a goroutine of its own, locked to its thread: if the thread cannot go back to its
	// namespace, the goroutine ends locked and the runtime discards the thread.
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netnstest: enter %s: %w", h.Name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("netnstest: leave %s: %w", h.Name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen listens on TCP port (0: any) at the host's address, inside the host; the listener is
// closed when the test ends.
func (h *Host) Listen(t testing.TB, port int) net.Listener {
	t.Helper()
	var ln net.Listener
	err := h.in(func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(h.Addr.String(), fmt.Sprint(port)))
		return err
	})
	if err != nil {
		t.Fatalf("netnstest: listen in %s: %v", h.Name, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// Dial connects to addr (host:port) from inside the host within timeout.
func (h *Host) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := h.in(func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, timeout)
		return err
	})
	return c, err
}

// Command prepares name with args to run inside the host.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
}

func (h *Host) remove() {
	_ = exec.Command("ip", "link", "del", h.link).Run()
	_ = exec.Command("ip", "netns", "del", h.Name).Run()
}
