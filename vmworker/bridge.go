package vmworker

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
)

// EnsureBridge creates the microVM bridge with its address if it does not exist yet, and sets
// it up. It is idempotent; launchers call the same before attaching their TAP devices.
func EnsureBridge(ctx context.Context, name string, addr netip.Prefix) error {
	if _, err := net.InterfaceByName(name); err != nil {
		if out, err := exec.CommandContext(ctx, "ip", "link", "add", name, "type", "bridge").CombinedOutput(); err != nil && !strings.Contains(string(out), "File exists") {
			return fmt.Errorf("vmworker: create bridge %s: %w: %s", name, err, strings.TrimSpace(string(out)))
		}
	}
	out, err := exec.CommandContext(ctx, "ip", "addr", "add", addr.String(), "dev", name).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "File exists") && !strings.Contains(string(out), "Address already assigned") {
		return fmt.Errorf("vmworker: address bridge %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	if out, err := exec.CommandContext(ctx, "ip", "link", "set", name, "up").CombinedOutput(); err != nil {
		return fmt.Errorf("vmworker: bring bridge %s up: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}
