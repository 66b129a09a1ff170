//go:build linux

package containerd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/edgebox/edgebox/agent/network"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Egress: a bridged container whose release restricts where it may
// connect has its policy (Config.Egress) applied once it is attached,
// matched by its address and its veth. The release's entries are kept in
// <StateDir>/net/<name>/egress, so that a restarted agent applies them
// again (Sweep) and its policies follow the names; the veth is the
// labelVeth label. A policy that cannot be enforced is refused: on
// network host, or on a box without a workload network or without
// Config.Egress.

var _ runtime.EgressCounter = (*Driver)(nil)

// egressOf checks the egress a workload asks for on its network mode
// and returns it, or nil when it restricts nothing.
func (d *Driver) egressOf(w *edgeboxv1.Workload, mode string) (*network.Egress, error) {
	e, err := network.ParseEgress(w.GetEgress())
	if err != nil {
		return nil, err
	}
	if e.Any {
		return nil, nil
	}
	switch {
	case mode == modeHost:
		return nil, errdefs.Invalid("egress cannot be enforced on network host: use network bridge")
	case mode == modeNone:
		return nil, nil // no network: nothing to let out
	case d.cfg.Network == nil || d.cfg.Egress == nil:
		return nil, errdefs.Unavailable("this box cannot enforce egress policies (no workload network): the workload is not started without its policy")
	}
	return &e, nil
}

// saveEgress records a bridged container's egress entries.
func (d *Driver) saveEgress(name string, w *edgeboxv1.Workload) error {
	return writeShared(d.egressPath(name), []byte(strings.Join(w.GetEgress(), "\n")+"\n"))
}

func (d *Driver) egressPath(name string) string { return filepath.Join(d.netDir(name), "egress") }

// applyEgress applies the recorded egress policy of container name, at
// addr behind veth, with the DNS servers of its resolv.conf. A container
// with no recorded policy has none to apply.
func (d *Driver) applyEgress(ctx context.Context, name string, addr netip.Addr, veth string) error {
	if d.cfg.Egress == nil {
		return nil
	}
	raw, err := os.ReadFile(d.egressPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("egress of %s: %w", name, err)
	}
	var entries []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			entries = append(entries, l)
		}
	}
	e, err := network.ParseEgress(entries)
	if err != nil || e.Any {
		return err
	}
	resolv, err := os.ReadFile(filepath.Join(d.netDir(name), "resolv.conf"))
	if err != nil {
		return fmt.Errorf("egress of %s: %w", name, err)
	}
	e.DNS = network.ResolvConfServers(resolv)
	return d.cfg.Egress.Apply(ctx, name, network.Source{Addr: addr, HostInterface: veth}, e)
}

// EgressRefused is how many connections container name's egress policy
// refused.
func (d *Driver) EgressRefused(ctx context.Context, name string) (uint64, error) {
	if d.cfg.Egress == nil {
		return 0, nil
	}
	if _, err := os.Stat(d.egressPath(name)); err != nil {
		return 0, nil // no policy: nothing refused, and no need to read the rules
	}
	return d.cfg.Egress.Refused(ctx, name)
}

// reapplyEgress applies again, in a new agent's Policies, the policies of
// the bridged containers that exist: their rules are on the box, but the
// names in them are followed only by the Policies that applied them.
func (d *Driver) reapplyEgress(ctx context.Context, containers map[string]map[string]string) error {
	if d.cfg.Egress == nil {
		return nil
	}
	var errs []error
	for name, labels := range containers {
		addr, err := netip.ParseAddr(labels[labelAddress])
		if labels[labelNetwork] != modeBridge || err != nil {
			continue
		}
		if err := d.applyEgress(ctx, name, addr, labels[labelVeth]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
