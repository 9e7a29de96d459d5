package config

import (
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/executor"
)

// VM configures the vm worker: its backend, the launchers' microVMs or OpenSandbox, and the
// endpoints guests reach.
type VM struct {
	Backend    string
	Image      string
	Kernel     string
	Initramfs  string
	Cmdline    string
	Firmware   string
	Hypervisor string
	CPUs       int
	MemoryMiB  int
	DiskGiB    int
	Bridge     string
	// BridgeCIDR is the bridge's own address with its network's length.
	BridgeCIDR netip.Prefix
	// GuestNet is the network guests connect from: the bridge's, or OPENSANDBOX_SANDBOX_CIDR.
	GuestNet netip.Prefix
	// NonceListen and FacadeGuestListen are where the nonce endpoint and the facade's guest
	// listener listen; NonceURL and FacadeGuestURL how guests reach them.
	NonceListen       string
	NonceURL          string
	FacadeGuestListen string
	FacadeGuestURL    string
	LauncherRoot      string
	// Egress is VM_EGRESS (none or nat); EgressAllow the raw VM_EGRESS_ALLOW list, resolved
	// at start (launcher.ParseDestinations); DNS the guests' name servers.
	Egress      string
	EgressAllow string
	DNS         []netip.Addr
	OpenSandbox OpenSandbox
}

// OpenSandbox configures the opensandbox VM backend.
type OpenSandbox struct {
	URL            string
	APIKeyFile     string
	Pool           string
	Image          string
	Scope          string
	SandboxTTL     time.Duration
	StartTimeout   time.Duration
	RequestTimeout time.Duration
	// Isolation is OPENSANDBOX_ISOLATION: what the pool's sandboxes are, as the operator
	// declares it (dynrunner cannot see it): vm for microVMs (Kata, Firecracker), or unknown.
	Isolation string
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func loadVM(e *env, c Controller, image string) VM {
	v := VM{
		Backend:      e.str("VM_BACKEND", "local"),
		Image:        image,
		Kernel:       e.str("VM_KERNEL", ""),
		Initramfs:    e.str("VM_INITRAMFS", ""),
		Cmdline:      e.str("VM_CMDLINE", ""),
		Firmware:     e.str("VM_FIRMWARE", ""),
		Hypervisor:   e.str("VM_HYPERVISOR", "cloud-hypervisor"),
		CPUs:         e.integer("VM_CPUS", 2, 1),
		MemoryMiB:    e.integer("VM_MEMORY_MIB", 2048, 256),
		DiskGiB:      e.integer("VM_DISK_GIB", 20, 1),
		Bridge:       e.str("VM_BRIDGE", "dynrunner0"),
		LauncherRoot: e.str("VM_LAUNCHER_ROOT", filepath.Join(c.StateDir, "vms")),
	}
	cidr := e.str("VM_BRIDGE_CIDR", "10.213.0.1/24")
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() || p.Bits() > 30 || p.Addr() == p.Masked().Addr() {
		e.fail("VM_BRIDGE_CIDR=%q: want the bridge's own IPv4 address with its prefix, e.g. 10.213.0.1/24", cidr)
	}
	v.BridgeCIDR, v.GuestNet = p, p.Masked()
	bridgeIP := p.Addr().String()
	v.NonceListen = e.str("VM_NONCE_LISTEN", net.JoinHostPort(bridgeIP, "7001"))
	v.FacadeGuestListen = e.str("RUNNER_FACADE_GUEST_LISTEN", net.JoinHostPort(bridgeIP, "8444"))
	v.FacadeGuestURL = e.str("RUNNER_FACADE_GUEST_URL", "https://"+v.FacadeGuestListen)
	v.NonceURL = "http://" + v.NonceListen
	if !c.Has(VMWorker) {
		return v
	}
	if !c.Has(Facade) {
		e.fail("the vm worker needs the facade in the same process in this release (it hands guests the facade's CA)")
	}
	switch v.Backend {
	case "local":
		loadLauncher(e, &v)
	case "opensandbox":
		loadOpenSandbox(e, c, &v)
	default:
		e.fail("VM_BACKEND=%q: want local or opensandbox", v.Backend)
	}
	for name, addr := range map[string]string{"VM_NONCE_LISTEN": v.NonceListen, "RUNNER_FACADE_GUEST_LISTEN": v.FacadeGuestListen} {
		ap, err := netip.ParseAddrPort(addr)
		switch {
		case err != nil || ap.Addr().IsUnspecified():
			e.fail("%s=%q: want a concrete address and port, never a wildcard", name, addr)
		case v.Backend == "local" && !v.GuestNet.Contains(ap.Addr()):
			e.fail("%s=%q: must be an address on the microVM bridge (%s)", name, addr, v.GuestNet)
		}
	}
	if urls, err := executor.ParseFacadeURLs(v.FacadeGuestURL); err != nil {
		e.fail("RUNNER_FACADE_GUEST_URL=%q: %v", v.FacadeGuestURL, err)
	} else {
		v.FacadeGuestURL = strings.Join(urls, ",")
	}
	return v
}

func loadLauncher(e *env, v *VM) {
	if v.Image == "" {
		e.fail("VM_IMAGE is required with the local vm backend: the base image microVM disks are converted from")
	}
	for name, path := range map[string]string{"VM_IMAGE": v.Image, "VM_KERNEL": v.Kernel, "VM_INITRAMFS": v.Initramfs, "VM_FIRMWARE": v.Firmware, "VM_LAUNCHER_ROOT": v.LauncherRoot} {
		if path != "" && (!filepath.IsAbs(path) || filepath.Clean(path) != path) {
			e.fail("%s=%q: want a clean absolute path", name, path)
		}
	}
	v.Egress = e.str("VM_EGRESS", "none")
	if v.Egress != "none" && v.Egress != "nat" {
		e.fail("VM_EGRESS=%q: want none or nat", v.Egress)
	}
	v.EgressAllow = e.str("VM_EGRESS_ALLOW", "")
	if v.EgressAllow != "" && v.Egress != "nat" {
		e.fail("VM_EGRESS_ALLOW is set but VM_EGRESS=%s: guests reach no destination without VM_EGRESS=nat", v.Egress)
	}
	for _, f := range strings.Split(e.str("VM_DNS", ""), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil || !a.Is4() {
			e.fail("VM_DNS=%q: want IPv4 addresses separated by commas", e.str("VM_DNS", ""))
			break
		}
		v.DNS = append(v.DNS, a)
	}
	if (v.Kernel == "") != (v.Initramfs == "") {
		e.fail("VM_KERNEL and VM_INITRAMFS must be set together (direct kernel boot)")
	}
	if v.Hypervisor != "cloud-hypervisor" && v.Hypervisor != "qemu" {
		e.fail("VM_HYPERVISOR=%q: want cloud-hypervisor or qemu", v.Hypervisor)
	}
}

func loadOpenSandbox(e *env, c Controller, v *VM) {
	o := OpenSandbox{
		URL:        e.str("OPENSANDBOX_URL", ""),
		APIKeyFile: e.str("OPENSANDBOX_API_KEY_FILE", ""),
		Pool:       e.str("OPENSANDBOX_POOL", "ci-vm"),
		Image:      e.str("OPENSANDBOX_IMAGE", ""),
		Scope:      e.str("OPENSANDBOX_SCOPE", "default"),
	}
	o.Isolation = e.str("OPENSANDBOX_ISOLATION", "unknown")
	switch {
	case o.Isolation != "vm" && o.Isolation != "unknown":
		e.fail("OPENSANDBOX_ISOLATION=%q: want vm (the pool's sandboxes are microVMs) or unknown", o.Isolation)
	case o.Isolation != "vm" && c.GrantsFile != "":
		e.fail("GRANTS_FILE with VM_BACKEND=opensandbox: grants promise that vm jobs get VM isolation, and OPENSANDBOX_ISOLATION=%s does not say the pool's sandboxes are microVMs; set OPENSANDBOX_ISOLATION=vm if they are (Kata, Firecracker), or use VM_BACKEND=local", o.Isolation)
	}
	o.SandboxTTL = e.duration("OPENSANDBOX_SANDBOX_TTL", 6*time.Hour, time.Minute)
	o.StartTimeout = e.duration("OPENSANDBOX_START_TIMEOUT", 60*time.Second, time.Second)
	o.RequestTimeout = e.duration("OPENSANDBOX_REQUEST_TIMEOUT", 30*time.Second, time.Second)
	if u, err := url.Parse(o.URL); o.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		e.fail("OPENSANDBOX_URL=%q: required with VM_BACKEND=opensandbox; want http(s)://host[:port][/v1] without credentials", o.URL)
	}
	if o.APIKeyFile == "" {
		e.fail("OPENSANDBOX_API_KEY_FILE is required with VM_BACKEND=opensandbox")
	}
	for _, name := range []string{"VM_EGRESS", "VM_EGRESS_ALLOW", "VM_DNS"} {
		if _, ok := e.lookup(name); ok {
			e.fail("%s applies to the local vm backend; OpenSandbox's network policy decides what sandboxes reach", name)
		}
	}
	if !dnsLabel.MatchString(o.Pool) {
		e.fail("OPENSANDBOX_POOL=%q: want a DNS label", o.Pool)
	}
	if o.SandboxTTL > 24*time.Hour {
		e.fail("OPENSANDBOX_SANDBOX_TTL=%s: at most 24h", o.SandboxTTL)
	}
	if o.StartTimeout >= c.Pickup {
		e.fail("OPENSANDBOX_START_TIMEOUT=%s must be below PICKUP_SECS (%s): the guest still has to register", o.StartTimeout, c.Pickup)
	}
	// Sandboxes are Pods of another cluster: they reach the nonce endpoint and the facade over
	// the network, from the sandbox network only.
	cidr := e.str("OPENSANDBOX_SANDBOX_CIDR", "")
	p, err := netip.ParsePrefix(cidr)
	if err != nil || p.Bits() == 0 {
		e.fail("OPENSANDBOX_SANDBOX_CIDR=%q: required with VM_BACKEND=opensandbox: the network sandboxes connect from (the only one the nonce endpoint and the guest listener serve)", cidr)
	}
	v.GuestNet = p.Masked()
	if _, ok := e.lookup("VM_NONCE_LISTEN"); !ok {
		e.fail("VM_NONCE_LISTEN is required with VM_BACKEND=opensandbox: an address sandboxes reach")
	}
	if _, ok := e.lookup("RUNNER_FACADE_GUEST_LISTEN"); !ok {
		e.fail("RUNNER_FACADE_GUEST_LISTEN is required with VM_BACKEND=opensandbox: an address sandboxes reach")
	}
	v.NonceURL = e.str("OPENSANDBOX_NONCE_URL", "http://"+v.NonceListen)
	if u, err := url.Parse(v.NonceURL); err != nil || u.Scheme != "http" || u.Host == "" {
		e.fail("OPENSANDBOX_NONCE_URL=%q: want http://host:port", v.NonceURL)
	}
	v.OpenSandbox = o
}

func (e *env) duration(name string, def, min time.Duration) time.Duration {
	s, ok := e.lookup(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < min {
		e.fail("%s=%q: want a Go duration of at least %s", name, s, min)
		return def
	}
	return d
}
