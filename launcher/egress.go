package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Egress modes (VM_EGRESS).
const (
	// EgressNone: guests reach nothing but the nonce endpoint and the facade's guest listener
	// on the bridge.
	EgressNone = "none"
	// EgressNAT: guests also reach the allowed destinations, masqueraded behind the host.
	EgressNAT = "nat"
)

// hostnameRe is a DNS name: dot-separated labels of letters, digits and inner hyphens.
var hostnameRe = regexp.MustCompile(`^(?i)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?$`)

// Destination is one entry of the guests' allow list: an IPv4 network and a TCP/UDP port, or
// every port when Port is zero.
type Destination struct {
	Net  netip.Prefix
	Port uint16
}

func (d Destination) String() string {
	s := d.Net.String()
	if d.Net.IsSingleIP() {
		s = d.Net.Addr().String()
	}
	if d.Port != 0 {
		s += ":" + strconv.Itoa(int(d.Port))
	}
	return s
}

// ParseDestinations parses an allow list: comma-separated IPV4[/PREFIX][:PORT] or
// HOSTNAME[:PORT] entries. resolve looks hostnames up (net.DefaultResolver.LookupNetIP with
// "ip4"); every IPv4 address a name has is allowed.
func ParseDestinations(ctx context.Context, list string, resolve func(ctx context.Context, host string) ([]netip.Addr, error)) ([]Destination, error) {
	var out []Destination
	for _, raw := range strings.Split(list, ",") {
		entry := strings.TrimSpace(raw)
		if entry == "" {
			continue
		}
		host, port := entry, uint16(0)
		if h, p, err := net.SplitHostPort(entry); err == nil {
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("launcher: egress destination %q: the port must be 1 to 65535", entry)
			}
			host, port = h, uint16(n)
		}
		if pfx, err := netip.ParsePrefix(host); err == nil {
			if !pfx.Addr().Is4() {
				return nil, fmt.Errorf("launcher: egress destination %q: guests have IPv4 only", entry)
			}
			out = append(out, Destination{Net: pfx.Masked(), Port: port})
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil {
			if !a.Is4() {
				return nil, fmt.Errorf("launcher: egress destination %q: guests have IPv4 only", entry)
			}
			out = append(out, Destination{Net: netip.PrefixFrom(a, 32), Port: port})
			continue
		}
		if !hostnameRe.MatchString(host) {
			return nil, fmt.Errorf("launcher: egress destination %q: want IPV4[/PREFIX][:PORT] or HOSTNAME[:PORT]", entry)
		}
		addrs, err := resolve(ctx, host)
		if err != nil {
			return nil, fmt.Errorf("launcher: egress destination %q: %w", entry, err)
		}
		n := 0
		for _, a := range addrs {
			if a = a.Unmap(); a.Is4() {
				out = append(out, Destination{Net: netip.PrefixFrom(a, 32), Port: port})
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("launcher: egress destination %q has no IPv4 address", entry)
		}
	}
	return out, nil
}

// Firewall is what guests on one bridge may reach. The controller applies it when the vm
// worker starts and removes it when no launcher is left.
type Firewall struct {
	Bridge string
	// BridgeCIDR is the bridge's own address with its network's length.
	BridgeCIDR netip.Prefix
	// HostPorts are the TCP ports on the bridge address guests may reach: the nonce endpoint
	// and the facade's guest listener.
	HostPorts []uint16
	// Mode is EgressNone or EgressNAT; Allow (with EgressNAT) the destinations beyond the host.
	Mode  string
	Allow []Destination
}

// Table is the nftables table (family inet) of bridge's firewall.
func Table(bridge string) string {
	return "dynrunner_" + strings.NewReplacer("-", "_", ".", "_").Replace(bridge)
}

// Ruleset renders the firewall as one nft script that replaces the table atomically. Every
// packet from a guest that is not an answer, not for the host's ports, and (with EgressNAT) not
// for an allowed destination is refused: TCP with a reset, the rest with an ICMP
// administratively-prohibited. Answers to guests pass; nothing else reaches them.
func (f Firewall) Ruleset() (string, error) {
	if err := checkIfName("firewall: bridge", f.Bridge); err != nil {
		return "", err
	}
	if f.Mode != EgressNone && f.Mode != EgressNAT {
		return "", fmt.Errorf("launcher: firewall: egress mode %q: want %s or %s", f.Mode, EgressNone, EgressNAT)
	}
	if !f.BridgeCIDR.Addr().Is4() || len(f.HostPorts) == 0 {
		return "", errors.New("launcher: firewall: needs the bridge's IPv4 address and the host ports guests reach")
	}
	t, br := Table(f.Bridge), strconv.Quote(f.Bridge)
	ports := make([]string, 0, len(f.HostPorts))
	for _, p := range slices.Sorted(slices.Values(f.HostPorts)) {
		ports = append(ports, strconv.Itoa(int(p)))
	}
	var b strings.Builder
	// "add table" then "delete table" removes an existing one without failing when there is
	// none; the script is applied as one transaction.
	fmt.Fprintf(&b, "add table inet %[1]s\ndelete table inet %[1]s\ntable inet %[1]s {\n", t)
	nat := f.Mode == EgressNAT && len(f.Allow) > 0
	if nat {
		b.WriteString("\tset allowed {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\tflags interval\n\t\telements = {\n")
		for _, d := range f.Allow {
			lo, hi := d.Port, d.Port
			if d.Port == 0 {
				lo, hi = 1, 65535
			}
			for _, proto := range []string{"tcp", "udp"} {
				fmt.Fprintf(&b, "\t\t\t%s . %s . %d-%d,\n", d.Net, proto, lo, hi)
			}
		}
		b.WriteString("\t\t}\n\t}\n")
	}
	refuse := "\t\tmeta l4proto tcp reject with tcp reset\n\t\treject with icmpx type admin-prohibited\n"
	allowed := ""
	if nat {
		allowed = "\t\tip daddr . meta l4proto . th dport @allowed accept\n"
	}
	fmt.Fprintf(&b, `	chain input {
		type filter hook input priority filter - 5; policy accept;
		iifname %[1]s jump from_guests_to_host
	}
	chain from_guests_to_host {
		ct state established,related accept
		meta nfproto ipv4 ip daddr %[2]s tcp dport { %[3]s } accept
%[4]s%[5]s	}
	chain forward {
		type filter hook forward priority filter - 5; policy accept;
		iifname %[1]s jump from_guests
		oifname %[1]s ct state established,related accept
		oifname %[1]s drop
	}
	chain from_guests {
		ct state established,related accept
%[4]s%[5]s	}
`, br, f.BridgeCIDR.Addr(), strings.Join(ports, ", "), allowed, refuse)
	if nat {
		fmt.Fprintf(&b, `	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %s oifname != %s masquerade
	}
`, f.BridgeCIDR.Masked(), br)
	}
	b.WriteString("}\n")
	return b.String(), nil
}

// ipForward is the host's IPv4 forwarding switch, which NAT egress needs on.
var ipForward = "/proc/sys/net/ipv4/ip_forward"

// ApplyFirewall installs f, replacing the bridge's previous firewall in one transaction. With
// EgressNAT it turns on IPv4 forwarding (reporting whether it was off) and, on hosts where
// Docker's FORWARD policy drops forwarded packets, accepts the bridge's traffic in Docker's
// DOCKER-USER chain after dynrunner's own chain has filtered it.
func ApplyFirewall(ctx context.Context, f Firewall) (forwardingTurnedOn bool, err error) {
	script, err := f.Ruleset()
	if err != nil {
		return false, err
	}
	if _, err := runInput(ctx, script, "nft", "-f", "-"); err != nil {
		return false, fmt.Errorf("launcher: apply the firewall of %s: %w", f.Bridge, err)
	}
	if f.Mode != EgressNAT || len(f.Allow) == 0 {
		return false, removeDockerUser(ctx, f.Bridge)
	}
	if cur, err := os.ReadFile(ipForward); err == nil && strings.TrimSpace(string(cur)) != "1" {
		if err := os.WriteFile(ipForward, []byte("1\n"), 0o644); err != nil {
			return false, fmt.Errorf("launcher: turn on IPv4 forwarding for VM_EGRESS=nat: %w", err)
		}
		forwardingTurnedOn = true
	}
	return forwardingTurnedOn, addDockerUser(ctx, f.Bridge)
}

// RemoveFirewall removes the bridge's firewall and its DOCKER-USER rules; it is idempotent.
func RemoveFirewall(ctx context.Context, bridge string) error {
	if err := checkIfName("firewall: bridge", bridge); err != nil {
		return err
	}
	t := Table(bridge)
	if _, err := runInput(ctx, fmt.Sprintf("add table inet %[1]s\ndelete table inet %[1]s\n", t), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("launcher: remove the firewall of %s: %w", bridge, err)
	}
	return removeDockerUser(ctx, bridge)
}

// dockerUserRules are the rules ApplyFirewall adds to Docker's DOCKER-USER chain, each
// recognisable by its comment.
func dockerUserRules(bridge string) [][]string {
	c := "dynrunner " + bridge
	return [][]string{
		{"-i", bridge, "-m", "comment", "--comment", c, "-j", "ACCEPT"},
		{"-o", bridge, "-m", "comment", "--comment", c, "-j", "ACCEPT"},
	}
}

// hasDockerUser reports whether iptables has Docker's DOCKER-USER chain.
func hasDockerUser(ctx context.Context) bool {
	if _, err := lookPath("iptables"); err != nil {
		return false
	}
	_, err := run(ctx, "iptables", "-w", "-n", "-L", "DOCKER-USER")
	return err == nil
}

func addDockerUser(ctx context.Context, bridge string) error {
	if !hasDockerUser(ctx) {
		return nil
	}
	for _, r := range dockerUserRules(bridge) {
		if _, err := run(ctx, "iptables", append([]string{"-w", "-C", "DOCKER-USER"}, r...)...); err == nil {
			continue
		}
		if _, err := run(ctx, "iptables", append([]string{"-w", "-I", "DOCKER-USER", "1"}, r...)...); err != nil {
			return fmt.Errorf("launcher: accept the bridge %s in Docker's DOCKER-USER chain: %w", bridge, err)
		}
	}
	return nil
}

func removeDockerUser(ctx context.Context, bridge string) error {
	if !hasDockerUser(ctx) {
		return nil
	}
	for _, r := range dockerUserRules(bridge) {
		for range 16 { // a rule inserted more than once is removed as often
			if _, err := run(ctx, "iptables", append([]string{"-w", "-D", "DOCKER-USER"}, r...)...); err != nil {
				break
			}
		}
	}
	return nil
}
