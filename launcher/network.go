package launcher

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

const (
	leasesDir  = ".ips"
	bridgeLock = ".bridge.lock"
	tapPrefix  = "dr"
	// tapAliasPrefix starts the alias (ifalias) of every TAP device the launcher creates,
	// followed by the instance directory. The sweep deletes only TAP devices carrying it.
	tapAliasPrefix = "dynrunner-launcher "
)

// TAPName is the TAP device of an instance: "dr" and the first 8 hex digits of its id.
func TAPName(id InstanceID) string { return tapPrefix + id.Short() }

// MAC is the guest NIC's address, derived from the instance id: the first 6 bytes of
// SHA-256("dynrunner-mac:" + id), marked locally administered and unicast.
func MAC(id InstanceID) net.HardwareAddr {
	sum := sha256.Sum256([]byte("dynrunner-mac:" + id.String()))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (1<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(a[:], v)
	return netip.AddrFrom4(a)
}

// allocateIP takes a lease on a free address of the bridge network: it creates
// <root>/.ips/<ip> with O_EXCL, holding the instance id. The search starts at an offset derived
// from the id, so concurrent launchers rarely contend. The bridge address, the endpoint, the
// network and the broadcast address are never handed out.
func allocateIP(root string, id InstanceID, bridge netip.Prefix, endpoint netip.Addr) (netip.Addr, error) {
	dir := filepath.Join(root, leasesDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return netip.Addr{}, fmt.Errorf("launcher: leases: %w", err)
	}
	net4 := bridge.Masked().Addr().As4()
	base := binary.BigEndian.Uint32(net4[:])
	hosts := uint32(1)<<(32-bridge.Bits()) - 2 // without network and broadcast
	start := binary.BigEndian.Uint32(id.b[12:]) % hosts
	for i := range hosts {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], base+1+(start+i)%hosts)
		ip := netip.AddrFrom4(a)
		if ip == bridge.Addr() || ip == endpoint {
			continue
		}
		err := writeFileExcl(filepath.Join(dir, ip.String()), []byte(id.String()+"\n"))
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("launcher: lease %s: %w", ip, err)
		}
		return ip, nil
	}
	return netip.Addr{}, fmt.Errorf("launcher: no free address left in %s", bridge)
}

// releaseIPs removes every lease holding id.
func releaseIPs(root string, id InstanceID) error {
	dir := filepath.Join(root, leasesDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if owner, ok := leaseOwner(p); ok && owner == id {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// leaseOwner reads the instance id in a lease file.
func leaseOwner(p string) (InstanceID, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return InstanceID{}, false
	}
	id, err := ParseInstanceID(strings.TrimSpace(string(b)))
	return id, err == nil
}

// EnsureBridge makes sure the microVM bridge exists with its address and is up, as every
// launch does; the vm worker calls it at start so the nonce endpoint can listen on it. root
// is the launchers' root directory (it holds the lock that serialises bridge setup).
func EnsureBridge(ctx context.Context, root, name string, addr netip.Prefix) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("launcher: root %s: %w", root, err)
	}
	return ensureBridge(ctx, root, name, addr)
}

// ensureBridge makes sure the bridge exists, carries its address and is up. It is idempotent
// and serialised across launchers by a flock on <root>/.bridge.lock.
func ensureBridge(ctx context.Context, root, name string, addr netip.Prefix) error {
	f, err := os.OpenFile(filepath.Join(root, bridgeLock), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("launcher: bridge lock: %w", err)
	}
	defer f.Close()
	if err := flock(f, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("launcher: bridge lock: %w", err)
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		if _, err := run(ctx, "ip", "link", "add", "name", name, "type", "bridge"); err != nil {
			return fmt.Errorf("launcher: create bridge %s: %w", name, err)
		}
		if ifc, err = net.InterfaceByName(name); err != nil {
			return fmt.Errorf("launcher: bridge %s: %w", name, err)
		}
	} else if _, err := os.Stat("/sys/class/net/" + name + "/bridge"); err != nil {
		return fmt.Errorf("launcher: %s exists and is not a bridge", name)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return fmt.Errorf("launcher: bridge %s addresses: %w", name, err)
	}
	has := false
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ones, _ := n.Mask.Size()
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == addr.Addr() && ones == addr.Bits() {
				has = true
			}
		}
	}
	if !has {
		if _, err := run(ctx, "ip", "addr", "add", addr.String(), "dev", name); err != nil {
			return fmt.Errorf("launcher: address bridge %s: %w", name, err)
		}
	}
	if ifc.Flags&net.FlagUp == 0 {
		if _, err := run(ctx, "ip", "link", "set", "dev", name, "up"); err != nil {
			return fmt.Errorf("launcher: bring bridge %s up: %w", name, err)
		}
	}
	return nil
}

// createTAP creates the persistent TAP device tap, labels it with alias, attaches it to the
// bridge and brings it up.
func createTAP(ctx context.Context, tap, alias, bridge string) error {
	if _, err := net.InterfaceByName(tap); err == nil {
		return fmt.Errorf("launcher: TAP device %s exists already (an instance whose id starts alike?)", tap)
	}
	steps := [][]string{
		{"tuntap", "add", "dev", tap, "mode", "tap"},
		{"link", "set", "dev", tap, "alias", alias},
		{"link", "set", "dev", tap, "master", bridge},
		// Isolated ports reach the host (the nonce endpoint, the facade) but not each other,
		// so one guest cannot talk to, or spoof, another on the bridge.
		{"link", "set", "dev", tap, "type", "bridge_slave", "isolated", "on"},
		{"link", "set", "dev", tap, "up"},
	}
	for _, s := range steps {
		if _, err := run(ctx, "ip", s...); err != nil {
			return fmt.Errorf("launcher: TAP %s: %w", tap, err)
		}
	}
	return nil
}

// tapAlias returns the ifalias of the TAP device tap, and whether the device exists.
func tapAlias(tap string) (string, bool) {
	b, err := os.ReadFile("/sys/class/net/" + tap + "/ifalias")
	if err != nil {
		_, err := os.Stat("/sys/class/net/" + tap)
		return "", err == nil
	}
	return strings.TrimSpace(string(b)), true
}

// deleteTAP deletes the TAP device tap if it exists and its alias is want or empty (a device
// created but killed before it was labelled). It never deletes a device labelled for another
// instance directory.
func deleteTAP(ctx context.Context, tap, want string) error {
	alias, ok := tapAlias(tap)
	if !ok {
		return nil
	}
	if alias != "" && alias != want {
		return nil
	}
	if _, err := run(ctx, "ip", "link", "delete", "dev", tap); err != nil {
		if _, still := tapAlias(tap); !still {
			return nil // gone meanwhile
		}
		return fmt.Errorf("launcher: delete TAP %s: %w", tap, err)
	}
	return nil
}
