package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Firewall is what job containers on a managed network may reach on the host itself: the
// addresses and TCP ports of Allow (the facade, and a forge that runs on the host), nothing
// else. It filters only what is addressed to the host (nftables' input hook); traffic the host
// forwards (to a forge or the internet elsewhere) passes as Docker routes it.
//
// One nftables table, "inet dynrunner_<bridge>", serves every controller on the host that
// uses the network: its rules are the same for all, and each controller adds its own
// destinations to the table's set "allowed" and removes them at shutdown.
type Firewall struct {
	// Bridge is the network's host interface (Network.Bridge).
	Bridge string
	// Allow lists the IPv4 addresses and TCP ports of the host job containers may reach.
	Allow []netip.AddrPort
}

// bridgeRe is a Linux interface name nft may quote.
var bridgeRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,14}$`)

// FirewallTable is the nftables table (family inet) of bridge's firewall.
func FirewallTable(bridge string) string {
	return "dynrunner_" + strings.NewReplacer("-", "_", ".", "_").Replace(bridge)
}

func (f Firewall) check() error {
	if !bridgeRe.MatchString(f.Bridge) {
		return fmt.Errorf("docker: firewall: bridge %q is not an interface name", f.Bridge)
	}
	for _, a := range f.Allow {
		if !a.Addr().Unmap().Is4() || a.Port() == 0 {
			return fmt.Errorf("docker: firewall: destination %s: want an IPv4 address and a port", a)
		}
	}
	return nil
}

// elements renders Allow as the elements of the set "allowed".
func (f Firewall) elements() string {
	es := make([]string, 0, len(f.Allow))
	for _, a := range f.Allow {
		es = append(es, a.Addr().Unmap().String()+" . "+strconv.Itoa(int(a.Port())))
	}
	slices.Sort(es)
	return strings.Join(slices.Compact(es), ", ")
}

// Ruleset renders the firewall as one nft script, applied as one transaction: it creates the
// table when missing, replaces its rules, and adds Allow to the set, keeping the destinations
// other controllers added. A packet from the bridge to the host that does not answer a
// connection of the host's and is not for an allowed destination is refused: TCP with a reset,
// the rest with an ICMP administratively-prohibited.
func (f Firewall) Ruleset() (string, error) {
	if err := f.check(); err != nil {
		return "", err
	}
	t := "inet " + FirewallTable(f.Bridge)
	var b strings.Builder
	fmt.Fprintf(&b, "add table %s\n", t)
	fmt.Fprintf(&b, "add set %s allowed { type ipv4_addr . inet_service; }\n", t)
	fmt.Fprintf(&b, "add chain %s input { type filter hook input priority filter - 5; policy accept; }\n", t)
	fmt.Fprintf(&b, "add chain %s from_jobs\n", t)
	fmt.Fprintf(&b, "flush chain %s input\n", t)
	fmt.Fprintf(&b, "flush chain %s from_jobs\n", t)
	fmt.Fprintf(&b, "add rule %s input iifname %s jump from_jobs\n", t, strconv.Quote(f.Bridge))
	fmt.Fprintf(&b, "add rule %s from_jobs ct state established,related accept\n", t)
	fmt.Fprintf(&b, "add rule %s from_jobs ip daddr . tcp dport @allowed accept\n", t)
	fmt.Fprintf(&b, "add rule %s from_jobs meta l4proto tcp reject with tcp reset\n", t)
	fmt.Fprintf(&b, "add rule %s from_jobs reject with icmpx type admin-prohibited\n", t)
	if len(f.Allow) > 0 {
		fmt.Fprintf(&b, "add element %s allowed { %s }\n", t, f.elements())
	}
	return b.String(), nil
}

// Apply installs the firewall (Ruleset). It needs root or CAP_NET_ADMIN and the nft program.
func (f Firewall) Apply(ctx context.Context) error {
	script, err := f.Ruleset()
	if err != nil {
		return err
	}
	if err := nft(ctx, script); err != nil {
		return fmt.Errorf("docker: install the job network's firewall on %s: %w", f.Bridge, err)
	}
	return nil
}

// Withdraw removes Allow from the table's set, leaving the rules (and other controllers'
// destinations) in place: with nothing allowed, the bridge reaches nothing on the host. It
// is idempotent.
func (f Firewall) Withdraw(ctx context.Context) error {
	if err := f.check(); err != nil {
		return err
	}
	t := "inet " + FirewallTable(f.Bridge)
	var errs []error
	for _, a := range f.Allow {
		// One element at a time: nft refuses the whole delete when one element is missing.
		one := Firewall{Bridge: f.Bridge, Allow: []netip.AddrPort{a}}
		err := nft(ctx, fmt.Sprintf("delete element %s allowed { %s }\n", t, one.elements()))
		if err != nil && !strings.Contains(err.Error(), "No such file or directory") {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("docker: withdraw from the job network's firewall on %s: %w", f.Bridge, err)
	}
	return nil
}

// RemoveFirewall deletes bridge's whole table, whatever other controllers added; for tests and
// for a network that is removed. It is idempotent.
func RemoveFirewall(ctx context.Context, bridge string) error {
	if err := (Firewall{Bridge: bridge}).check(); err != nil {
		return err
	}
	t := "inet " + FirewallTable(bridge)
	if err := nft(ctx, fmt.Sprintf("add table %[1]s\ndelete table %[1]s\n", t)); err != nil {
		return fmt.Errorf("docker: remove the job network's firewall on %s: %w", bridge, err)
	}
	return nil
}

// nft runs "nft -f -" with script on its standard input.
func nft(ctx context.Context, script string) error {
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 2000 {
			msg = msg[:2000] + "..."
		}
		return fmt.Errorf("nft: %w: %s", err, msg)
	}
	return nil
}
