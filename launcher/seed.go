package launcher

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Seed file names: NoCloud reads exactly these from a volume labelled cidata.
const (
	seedMetaData      = "meta-data"
	seedUserData      = "user-data"
	seedNetworkConfig = "network-config"
	seedVolumeID      = "cidata"
)

// seedData is what goes into the NoCloud seed: the instance id, the nonce, the nonce endpoint
// and the guest's network configuration. Never a token.
type seedData struct {
	ID       InstanceID
	Nonce    Nonce
	Endpoint Endpoint
	MAC      net.HardwareAddr
	Addr     netip.Prefix // the guest's address with the bridge's prefix length
	Gateway  netip.Addr   // the bridge address
	DNS      []netip.Addr // name servers, optional
}

// Hostname is the guest's hostname: dynrunner-<first 8 hex digits of the instance id>.
func Hostname(id InstanceID) string { return "dynrunner-" + id.Short() }

// metaData renders meta-data. Every value is a double-quoted YAML scalar; none of them can
// contain a quote or a backslash (the instance id is hexadecimal, the nonce URL-safe base64,
// the endpoint an IP and a port).
func (d seedData) metaData() []byte {
	return fmt.Appendf(nil, "instance-id: %s\nlocal-hostname: %s\ndynrunner-nonce: %s\ndynrunner-endpoint: %s\n",
		strconv.Quote(d.ID.String()), strconv.Quote(Hostname(d.ID)), strconv.Quote(d.Nonce.Reveal()),
		strconv.Quote(d.Endpoint.String()))
}

// userData renders user-data: a cloud-config with nothing secret in it.
func (d seedData) userData() []byte {
	return []byte("#cloud-config\n" +
		"# Written by dynrunner launcher. Nothing secret: the guest fetches its single-use\n" +
		"# registration token through the nonce endpoint named in meta-data.\n" +
		"ssh_pwauth: false\n" +
		"disable_root: true\n")
}

// networkConfig renders network-config (version 2): the static address, matched by the MAC the
// launcher gave the guest's NIC, with the default route via the bridge, and the name servers.
func (d seedData) networkConfig() []byte {
	var ns string
	if len(d.DNS) > 0 {
		ns = "    nameservers:\n      addresses:\n"
		for _, a := range d.DNS {
			ns += "        - " + strconv.Quote(a.String()) + "\n"
		}
	}
	return fmt.Appendf(nil, `version: 2
ethernets:
  eth0:
    match:
      macaddress: %s
    set-name: eth0
    addresses:
      - %s
    routes:
      - to: "0.0.0.0/0"
        via: %s
%s`, strconv.Quote(d.MAC.String()), strconv.Quote(d.Addr.String()), strconv.Quote(d.Gateway.String()), ns)
}

// writeSeed builds the seed ISO iso (genisoimage -volid cidata -joliet -rock) from d. The
// staging directory inside dir is removed afterwards.
func writeSeed(ctx context.Context, dir, iso string, d seedData) error {
	stage := filepath.Join(dir, "seed.d")
	if err := os.Mkdir(stage, 0o700); err != nil {
		return fmt.Errorf("launcher: seed: %w", err)
	}
	defer os.RemoveAll(stage)
	files := []struct {
		name string
		data []byte
	}{
		{seedMetaData, d.metaData()},
		{seedUserData, d.userData()},
		{seedNetworkConfig, d.networkConfig()},
	}
	args := []string{"-quiet", "-output", iso, "-volid", seedVolumeID, "-joliet", "-rock"}
	for _, f := range files {
		p := filepath.Join(stage, f.name)
		if err := writeFileExcl(p, f.data); err != nil {
			return fmt.Errorf("launcher: seed %s: %w", f.name, err)
		}
		args = append(args, p)
	}
	if _, err := run(ctx, "genisoimage", args...); err != nil {
		return fmt.Errorf("launcher: seed ISO: %w", err)
	}
	return nil
}

// writeFileExcl creates p (which must not exist) with mode 0600 and writes data.
func writeFileExcl(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
