package qemu

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/edgebox/edgebox/agent/network"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Network is edgebox's workload network a bridged VM is attached to.
type Network = network.Network

// EgressPolicies enforce the egress policies of bridged VMs.
type EgressPolicies = network.Policies

// netIDPrefix marks the network attachments of VMs. Object names are
// lower case, so no container's attachment can carry it.
const netIDPrefix = "VM-"

// netID is the id VM name is attached to the network under (its
// namespace's name too).
func netID(name string) string { return netIDPrefix + name }

// HoldsNetwork says whether id is the network attachment of a VM the
// driver holds: what network.Network.Sweep must keep for this driver.
// Ids of VMs that do not exist (and ids that are not a VM's) are not
// held.
func (d *Driver) HoldsNetwork(id string) bool {
	name, ok := strings.CutPrefix(id, netIDPrefix)
	if !ok {
		return false
	}
	_, err := d.load(name)
	return err == nil
}

func (d *Driver) haveBridge() bool { return d.cfg.Network != nil }

// bridgeUp attaches VM name to the bridge, or finds it attached (an
// agent restarted, a VM started again), and opens its tap for QEMU. What
// it attached is recorded in in.Net (and saved) before the tap is made,
// so a crash leaves nothing the driver does not know of. Hold d.mu.
func (d *Driver) bridgeUp(ctx context.Context, in *instance, ps []port) (*os.File, guestNet, error) {
	n := d.cfg.Network
	id := netID(in.Name)
	ns := n.NetnsPath(id)
	subnet, err := netip.ParsePrefix(n.Config().Subnet)
	if err != nil {
		return nil, guestNet{}, fmt.Errorf("VM %s: the network's subnet: %w", in.Name, err)
	}
	g := guestNet{DNS: d.guestDNS()}
	if in.Net != nil && in.Net.Mode == netBridge && in.Net.Addr != "" {
		// Attached before: keep the address, if the namespace still holds
		// the attachment (it does not after a reboot).
		if err := network.AttachTap(ns); err == nil {
			if f, err := network.OpenTap(ns); err == nil {
				g.Addr, _ = netip.ParsePrefix(in.Net.Addr)
				g.Gateway, _ = netip.ParseAddr(in.Net.Gateway)
				return f, g, nil
			}
		}
		d.log.Info("a VM's network attachment is gone; attaching it again", "vm", in.Name)
	}
	// Whatever a crash or a reboot left goes first: the plugins refuse a
	// second attachment of an id. An agent killed during the attach left
	// the namespace, made first; after a reboot there is the record.
	if _, err := os.Lstat(ns); err == nil || (in.Net != nil && in.Net.Mode == netBridge) {
		if err := d.bridgeDown(ctx, in.Name, ps); err != nil {
			return nil, guestNet{}, err
		}
	}
	if _, err := network.CreateNetns(n.Config().NetnsDir, id); err != nil {
		return nil, guestNet{}, fmt.Errorf("VM %s: %w", in.Name, err)
	}
	res, err := n.Attach(ctx, id, ns, netPorts(ps))
	if err != nil {
		network.RemoveNetns(ns)
		return nil, guestNet{}, fmt.Errorf("VM %s: %w", in.Name, err)
	}
	g.Addr = netip.PrefixFrom(res.IP, subnet.Bits())
	g.Gateway = res.Gateway
	in.Net = &vmNet{Mode: netBridge, Addr: g.Addr.String(), Gateway: g.Gateway.String(), HostIf: res.HostInterface, Ports: ps}
	if err := d.save(*in); err != nil {
		return nil, guestNet{}, err
	}
	if err := network.AttachTap(ns); err != nil {
		return nil, guestNet{}, fmt.Errorf("VM %s: %w", in.Name, err)
	}
	f, err := network.OpenTap(ns)
	if err != nil {
		return nil, guestNet{}, fmt.Errorf("VM %s: %w", in.Name, err)
	}
	d.log.Info("VM attached to the bridge", "vm", in.Name, "ip", g.Addr, "ports", len(ps))
	return f, g, nil
}

// bridgeDown detaches VM name from the bridge: its tap, address, rules
// and namespace. What is already gone is not an error.
func (d *Driver) bridgeDown(ctx context.Context, name string, ps []port) error {
	n := d.cfg.Network
	if n == nil {
		return nil
	}
	id := netID(name)
	ns := n.NetnsPath(id)
	var errs []error
	if p := d.cfg.Egress; p != nil {
		errs = append(errs, p.Remove(context.WithoutCancel(ctx), id))
	}
	d.egressMu.Lock()
	delete(d.egressFor, name)
	d.egressMu.Unlock()
	errs = append(errs, network.RemoveTap(ns))
	errs = append(errs, n.Detach(context.WithoutCancel(ctx), id, ns, netPorts(ps)))
	errs = append(errs, network.RemoveNetns(ns))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("VM %s: detaching from the bridge: %w", name, err)
	}
	return nil
}

// sweepNetwork detaches the VMs whose namespaces are still there but
// which the driver no longer holds. Attachments without a namespace (a
// reboot) are network.Network.Sweep's, with HoldsNetwork. Hold d.mu.
func (d *Driver) sweepNetwork(ctx context.Context) ([]string, error) {
	n := d.cfg.Network
	if n == nil {
		return nil, nil
	}
	ents, err := os.ReadDir(n.Config().NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var gone []string
	var errs []error
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), netIDPrefix)
		if !ok || d.HoldsNetwork(e.Name()) {
			continue
		}
		if err := d.bridgeDown(ctx, name, nil); err != nil {
			errs = append(errs, err)
			continue
		}
		gone = append(gone, name)
	}
	return gone, errors.Join(errs...)
}

// guestDNS are the box's resolvers a guest can reach.
func (d *Driver) guestDNS() []netip.Addr {
	conf, err := network.ResolvConf(network.HostResolvConf, network.UpstreamResolvConf)
	if err != nil {
		d.log.Warn("no DNS server for VMs", "err", err)
		return nil
	}
	return network.ResolvConfServers(conf)
}

// applyEgress enforces the egress policy of bridged VM in (attached),
// from its workload w: its traffic through its veth is allowed to w's
// destinations and the box's resolvers only. A VM that restricts nothing
// has its policy, if any, removed.
func (d *Driver) applyEgress(ctx context.Context, in instance, w *edgeboxv1.Workload) error {
	p := d.cfg.Egress
	id := netID(in.Name)
	if !restrictsEgress(w) {
		if p != nil {
			return p.Remove(ctx, id)
		}
		return nil
	}
	if p == nil {
		return errdefs.Unavailable("VM %s: its release restricts egress, and this box has no egress policies to enforce it", in.Name)
	}
	e, err := network.ParseEgress(w.GetEgress())
	if err != nil {
		return fmt.Errorf("VM %s: %w", in.Name, err)
	}
	for _, a := range d.guestDNS() {
		if a.Is4() {
			e.DNS = append(e.DNS, a)
		}
	}
	prefix, err := netip.ParsePrefix(in.Net.Addr)
	if err != nil {
		return fmt.Errorf("VM %s: its recorded address: %w", in.Name, err)
	}
	if err := p.Apply(ctx, id, network.Source{Addr: prefix.Addr(), HostInterface: in.Net.HostIf}, e); err != nil {
		return fmt.Errorf("VM %s: %w", in.Name, err)
	}
	d.egressMu.Lock()
	d.egressFor[in.Name] = in.Net.Addr
	d.egressMu.Unlock()
	return nil
}

// ensureEgress applies the policy of a running bridged VM that this
// process has not applied yet: after an agent restart the rules are still
// there, but nobody follows the names in them.
func (d *Driver) ensureEgress(ctx context.Context, in instance) {
	if d.cfg.Egress == nil {
		return
	}
	d.egressMu.Lock()
	done := d.egressFor[in.Name] == in.Net.Addr
	d.egressMu.Unlock()
	if done {
		return
	}
	var w edgeboxv1.Workload
	if err := protojson.Unmarshal(in.Workload, &w); err != nil || !restrictsEgress(&w) {
		// Nothing to apply at this address: not looked at again each scan.
		d.egressMu.Lock()
		d.egressFor[in.Name] = in.Net.Addr
		d.egressMu.Unlock()
		return
	}
	if err := d.applyEgress(ctx, in, &w); err != nil {
		d.log.Warn("applying a VM's egress policy again", "vm", in.Name, "err", err)
	}
}

// EgressRefused is how many packets VM name's egress policy refused (for
// TCP, one per connection), for its status.
func (d *Driver) EgressRefused(ctx context.Context, name string) (uint64, error) {
	if d.cfg.Egress == nil || !edgeboxv1.ValidObjectName(name) {
		return 0, nil
	}
	return d.cfg.Egress.Refused(ctx, netID(name))
}

func netPorts(ps []port) []network.Port {
	out := make([]network.Port, 0, len(ps))
	for _, p := range ps {
		out = append(out, network.Port{HostPort: p.HostPort, ContainerPort: p.Port, Protocol: p.Protocol, HostIP: p.HostIP})
	}
	return out
}
