package docker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
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

// network is what the backend reads of a network's inspection.
type network struct {
	ID      string            `json:"Id"`
	Name    string            `json:"Name"`
	Driver  string            `json:"Driver"`
	Options map[string]string `json:"Options"`
	Labels  map[string]string `json:"Labels"`
	IPAM    struct {
		Config []struct {
			Subnet  string `json:"Subnet"`
			Gateway string `json:"Gateway"`
		} `json:"Config"`
	} `json:"IPAM"`
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
	if isNotFound(err) {
		err = b.createNetwork(ctx, subnet)
		if err == nil || statusOf(err) == http.StatusConflict { // another controller was first
			n, err = b.inspectNetwork(ctx)
		}
	}
	if err != nil {
		return Network{}, fmt.Errorf("docker: network %s: %w", b.network, err)
	}
	return b.networkOf(n)
}

func (b *Backend) inspectNetwork(ctx context.Context) (network, error) {
	var n network
	err := b.eng.call(ctx, http.MethodGet, "/networks/"+url.PathEscape(b.network), nil, nil, &n)
	return n, err
}

func (b *Backend) createNetwork(ctx context.Context, subnet netip.Prefix) error {
	type ipamConfig struct {
		Subnet  string `json:"Subnet"`
		Gateway string `json:"Gateway"`
	}
	req := struct {
		Name     string            `json:"Name"`
		Driver   string            `json:"Driver"`
		Internal bool              `json:"Internal"`
		Options  map[string]string `json:"Options"`
		Labels   map[string]string `json:"Labels"`
		IPAM     struct {
			Driver string       `json:"Driver"`
			Config []ipamConfig `json:"Config"`
		} `json:"IPAM"`
	}{
		Name: b.network, Driver: "bridge",
		Options: map[string]string{optionICC: "false"},
		Labels:  map[string]string{LabelManaged: "true"},
	}
	req.IPAM.Driver = "default"
	if subnet.IsValid() {
		req.IPAM.Config = []ipamConfig{{Subnet: subnet.Masked().String(), Gateway: subnet.Masked().Addr().Next().String()}}
	}
	var created struct {
		ID      string `json:"Id"`
		Warning string `json:"Warning"`
	}
	if err := b.eng.call(ctx, http.MethodPost, "/networks/create", nil, req, &created); err != nil {
		return err
	}
	if created.Warning != "" {
		b.log.Warn().Str("network", b.network).Str("warning", created.Warning).Msg("engine warning on network create")
	}
	b.log.Info().Str("network", b.network).Str("id", shortID(created.ID)).Msg("created the isolated job network")
	return nil
}

// networkOf reads what the backend needs of n, and refuses a network labelled as dynrunner's
// that is not an isolated bridge.
func (b *Backend) networkOf(n network) (Network, error) {
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
		p, err := netip.ParsePrefix(c.Subnet)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		out.Subnet = p.Masked()
		out.Gateway = out.Subnet.Addr().Next()
		if g, err := netip.ParseAddr(c.Gateway); err == nil && out.Subnet.Contains(g) {
			out.Gateway = g
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
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("docker: network %s: %w", b.network, err)
	}
	if n.Labels[LabelManaged] != "true" {
		return fmt.Errorf("docker: network %s: %w", b.network, ErrNotManaged)
	}
	if err := b.eng.call(ctx, http.MethodDelete, "/networks/"+url.PathEscape(n.ID), nil, nil, nil); err != nil && !isNotFound(err) {
		return fmt.Errorf("docker: remove network %s: %w", b.network, err)
	}
	return nil
}
