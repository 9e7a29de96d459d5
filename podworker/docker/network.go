package docker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// Options of Docker's bridge driver the backend sets on the networks it creates.
const (
	optionICC    = "com.docker.network.bridge.enable_icc"
	optionBridge = "com.docker.network.bridge.name"
)

// HostNetwork is the Network value that shares the host's network namespace.
const HostNetwork = "host"

// ErrNetworkNotIsolated reports a network labelled as dynrunner's whose containers can reach
// each other (someone created it by hand with the label): the backend refuses to run jobs on
// it.
var ErrNetworkNotIsolated = errors.New("docker: job network is not isolated")

// Network is the network job containers run on, as PrepareNetwork found or created it.
type Network struct {
	// Name is Config.Network.
	Name string
	// Managed is true for a network dynrunner created (LabelManaged): an isolated bridge whose
	// containers cannot reach each other, and whose host side the controller firewalls
	// (Firewall). False for "host" and for networks an operator made.
	Managed bool
	// ID, Bridge (the host's interface), Subnet and Gateway (the host's address on it) are set
	// for bridge networks.
	ID      string
	Bridge  string
	Subnet  netip.Prefix
	Gateway netip.Addr
}

// PrepareNetwork returns the job containers' network, creating it when it does not exist: an
// isolated bridge labelled as dynrunner's, whose containers cannot reach each other (inter-
// container communication off), on subnet (or one the engine picks when subnet is not
// valid). An existing network is used as it is; one labelled as dynrunner's must still be
// isolated (ErrNetworkNotIsolated otherwise). "host" needs no preparation.
func (b *Backend) PrepareNetwork(ctx context.Context, subnet netip.Prefix) (Network, error) {
	if b.network == HostNetwork {
		return Network{Name: HostNetwork}, nil
	}
	n, err := b.inspectNetwork(ctx)
	if cerrdefs.IsNotFound(err) {
		err = b.createNetwork(ctx, subnet)
		if err == nil || cerrdefs.IsConflict(err) { // another controller was first
			n, err = b.inspectNetwork(ctx)
		}
	}
	if err != nil {
		return Network{}, fmt.Errorf("docker: network %s: %w", b.network, err)
	}
	return b.networkOf(n)
}

func (b *Backend) inspectNetwork(ctx context.Context) (network.Inspect, error) {
	api, err := b.eng.api(ctx)
	if err != nil {
		return network.Inspect{}, err
	}
	res, err := api.NetworkInspect(ctx, b.network, client.NetworkInspectOptions{})
	return res.Network, err
}

func (b *Backend) createNetwork(ctx context.Context, subnet netip.Prefix) error {
	api, err := b.eng.api(ctx)
	if err != nil {
		return err
	}
	ipam := &network.IPAM{Driver: "default"}
	if subnet.IsValid() {
		ipam.Config = []network.IPAMConfig{{Subnet: subnet.Masked(), Gateway: subnet.Masked().Addr().Next()}}
	}
	created, err := api.NetworkCreate(ctx, b.network, client.NetworkCreateOptions{
		Driver:  "bridge",
		IPAM:    ipam,
		Options: map[string]string{optionICC: "false"},
		Labels:  map[string]string{LabelManaged: "true"},
	})
	if err != nil {
		return err
	}
	for _, w := range created.Warning {
		b.log.Warn().Str("network", b.network).Str("warning", w).Msg("engine warning on network create")
	}
	b.log.Info().Str("network", b.network).Str("id", shortID(created.ID)).Msg("created the isolated job network")
	return nil
}

// networkOf reads what the backend needs of n, and refuses a network labelled as dynrunner's
// that is not an isolated bridge.
func (b *Backend) networkOf(n network.Inspect) (Network, error) {
	out := Network{Name: b.network, ID: n.ID, Managed: n.Labels[LabelManaged] == "true"}
	if n.Driver != "bridge" {
		if out.Managed {
			return Network{}, fmt.Errorf("docker: network %s is labelled %s=true but its driver is %q, not bridge: %w", b.network, LabelManaged, n.Driver, ErrNetworkNotIsolated)
		}
		return out, nil
	}
	out.Bridge = n.Options[optionBridge]
	if out.Bridge == "" && len(n.ID) >= 12 {
		out.Bridge = "br-" + n.ID[:12] // the bridge driver's own naming
	}
	for _, c := range n.IPAM.Config {
		if !c.Subnet.IsValid() || !c.Subnet.Addr().Is4() {
			continue
		}
		out.Subnet = c.Subnet.Masked()
		out.Gateway = out.Subnet.Addr().Next()
		if c.Gateway.IsValid() && out.Subnet.Contains(c.Gateway) {
			out.Gateway = c.Gateway
		}
		break
	}
	if !out.Managed {
		return out, nil
	}
	if n.Options[optionICC] != "false" {
		return Network{}, fmt.Errorf("docker: network %s is labelled %s=true but lets containers reach each other (%s is not false); remove it and let the controller create it: %w", b.network, LabelManaged, optionICC, ErrNetworkNotIsolated)
	}
	if out.Bridge == "" || !out.Gateway.IsValid() {
		return Network{}, fmt.Errorf("docker: network %s: no IPv4 subnet or bridge interface in its inspection: %w", b.network, ErrNetworkNotIsolated)
	}
	return out, nil
}

// RemoveNetwork removes the job network when dynrunner created it (tests, and operators who
// retire a host); it is idempotent and refuses while containers are attached.
func (b *Backend) RemoveNetwork(ctx context.Context) error {
	if b.network == HostNetwork {
		return nil
	}
	n, err := b.inspectNetwork(ctx)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("docker: network %s: %w", b.network, err)
	}
	if n.Labels[LabelManaged] != "true" {
		return fmt.Errorf("docker: network %s: %w", b.network, ErrNotManaged)
	}
	if err := b.removeNetwork(ctx, n.ID); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("docker: remove network %s: %w", b.network, err)
	}
	return nil
}

func (b *Backend) removeNetwork(ctx context.Context, id string) error {
	api, err := b.eng.api(ctx)
	if err != nil {
		return err
	}
	_, err = api.NetworkRemove(ctx, id, client.NetworkRemoveOptions{})
	return err
}
