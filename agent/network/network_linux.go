package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	gocni "github.com/containerd/go-cni"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/atomicfile"
)

// ifName is the workload's interface; go-cni names the first network's
// interface eth0.
const ifName = "eth0"

// Network attaches workloads to edgebox's bridge.
type Network struct {
	cfg    Config
	subnet netip.Prefix
	cni    gocni.CNI
	log    *slog.Logger

	// mu guards attaching: the workloads in Attach and the host ports
	// they publish, which libcni's cache shows only once they are done.
	mu        sync.Mutex
	attaching map[string][]Port
}

// Result is what a workload got from Attach.
type Result struct {
	// IP is the workload's address on the bridge.
	IP netip.Addr
	// Gateway is the bridge's address, the workload's default route.
	Gateway netip.Addr
	// HostInterface is the box's end of the workload's veth pair.
	HostInterface string
	// Ports are the ports published for it.
	Ports []Port
}

// New checks cfg, finds the plugins and writes the network's
// configuration; it changes nothing on the box's network (the bridge is
// made by the first Attach).
func New(cfg Config, log *slog.Logger) (*Network, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	subnet, _ := parseSubnet(cfg.Subnet)
	for _, plugin := range []string{"loopback", "bridge", "host-local", "portmap", "firewall"} {
		if findPlugin(cfg.PluginDirs, plugin) == "" {
			return nil, errdefs.Unavailable("network: CNI plugin %q not found in %s (install containernetworking-plugins)",
				plugin, strings.Join(cfg.PluginDirs, ", "))
		}
	}
	conf, err := confList(cfg)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("network: state directory: %w", err)
	}
	// The file is for people and tools such as cnitool; the network is
	// loaded from the same bytes.
	if err := atomicfile.Write(filepath.Join(cfg.StateDir, "edgebox.conflist"), conf); err != nil {
		return nil, fmt.Errorf("network: writing the CNI configuration: %w", err)
	}
	quietLockChecker()
	c, err := gocni.New(
		gocni.WithPluginDir(cfg.PluginDirs),
		gocni.WithMinNetworkCount(2),
		gocni.WithConfListBytes(conf), // first, so its interface is eth0
		gocni.WithLoNetwork,
	)
	if err != nil {
		return nil, fmt.Errorf("network: loading the CNI configuration: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Network{
		cfg:       cfg,
		subnet:    subnet,
		cni:       c,
		log:       log.With("component", "network", "network", cfg.Name),
		attaching: map[string][]Port{},
	}, nil
}

// Config is the network's configuration, defaults filled in.
func (n *Network) Config() Config { return n.cfg }

// NetnsPath is where the namespace of workload id lives, for CreateNetns
// and Sweep.
func (n *Network) NetnsPath(id string) string { return filepath.Join(n.cfg.NetnsDir, id) }

// Attach gives workload id an address on the bridge inside the namespace
// at netnsPath, with NAT for outbound traffic and ports published. On
// failure nothing is left attached. An id already attached, or a host
// port another workload publishes, is an errdefs.ErrConflict error.
func (n *Network) Attach(ctx context.Context, id, netnsPath string, ports []Port) (Result, error) {
	if err := validID(id); err != nil {
		return Result{}, err
	}
	if err := ValidatePorts(ports); err != nil {
		return Result{}, err
	}
	if !isNetns(netnsPath) {
		return Result{}, errdefs.Invalid("network: attaching %s: %q is not a network namespace", id, netnsPath)
	}
	if err := enableForwarding(); err != nil {
		return Result{}, err
	}
	if err := n.reserve(id, ports); err != nil {
		return Result{}, err
	}
	defer n.release(id)
	res, err := n.cni.SetupSerially(ctx, id, netnsPath, gocni.WithCapabilityPortMap(portMappings(ports)))
	if err != nil {
		// libcni does not undo the plugins that succeeded.
		n.undo(ctx, id, netnsPath, ports)
		return Result{}, fmt.Errorf("network: attaching %s: %w", id, err)
	}
	out := Result{Ports: append([]Port(nil), ports...)}
	for name, intf := range res.Interfaces {
		switch {
		case name == ifName:
			for _, ipc := range intf.IPConfigs {
				if a, ok := netip.AddrFromSlice(ipc.IP); ok && a.Unmap().Is4() {
					out.IP = a.Unmap()
					out.Gateway, _ = netip.AddrFromSlice(ipc.Gateway)
					out.Gateway = out.Gateway.Unmap()
				}
			}
		case intf.Sandbox == "" && name != n.cfg.Bridge && name != "lo":
			out.HostInterface = name
		}
	}
	if !out.IP.IsValid() {
		n.undo(ctx, id, netnsPath, ports)
		return Result{}, fmt.Errorf("network: attaching %s: the plugins gave no IPv4 address", id)
	}
	n.log.Info("workload attached", "workload", id, "ip", out.IP, "ports", len(ports))
	return out, nil
}

// undo detaches what a failed Attach did, even if ctx has ended.
func (n *Network) undo(ctx context.Context, id, netnsPath string, ports []Port) {
	if err := n.Detach(context.WithoutCancel(ctx), id, netnsPath, ports); err != nil {
		n.log.Warn("undoing a failed attach", "workload", id, "err", err)
	}
}

// reserve claims id and the host ports it publishes for an Attach: it
// fails if id is attached or being attached, or if another workload,
// attached or being attached, publishes one of the ports.
func (n *Network) reserve(id string, ports []Port) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.attaching[id]; ok {
		return errdefs.Conflict("network: workload %s is being attached", id)
	}
	atts, err := n.cachedAttachments()
	if err != nil {
		return err
	}
	if _, ok := atts[id]; ok {
		return errdefs.Conflict("network: workload %s is already attached; detach it first", id)
	}
	taken := map[string][]Port{}
	for other, a := range atts {
		for _, pm := range a.ports {
			taken[other] = append(taken[other], Port{HostPort: int(pm.HostPort), ContainerPort: int(pm.ContainerPort), Protocol: pm.Protocol, HostIP: pm.HostIP})
		}
	}
	for other, ps := range n.attaching {
		taken[other] = append(taken[other], ps...)
	}
	for _, p := range ports {
		for other, ps := range taken {
			for _, q := range ps {
				if p.HostPort == q.HostPort && p.proto() == q.proto() && (p.HostIP == "" || q.HostIP == "" || p.HostIP == q.HostIP) {
					return errdefs.Conflict("network: port %s: host port %d/%s is already published by workload %s", p, p.HostPort, p.proto(), other)
				}
			}
		}
	}
	n.attaching[id] = ports
	return nil
}

func (n *Network) release(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.attaching, id)
}

// Detach removes workload id from the bridge: its address, veth pair,
// published ports and NAT and firewall rules. What is already gone is not
// an error, and netnsPath may name a namespace that no longer exists.
func (n *Network) Detach(ctx context.Context, id, netnsPath string, ports []Port) error {
	if err := validID(id); err != nil {
		return err
	}
	if netnsPath != "" && !isNetns(netnsPath) {
		netnsPath = "" // the plugins then release what is outside the namespace
	}
	ids := map[string]bool{id: true}
	leases, err := n.leases()
	if err != nil {
		return fmt.Errorf("network: detaching %s: %w", id, err)
	}
	if err := n.cni.Remove(ctx, id, netnsPath, gocni.WithCapabilityPortMap(portMappings(ports))); err != nil {
		return fmt.Errorf("network: detaching %s: %w", id, err)
	}
	// With no namespace the bridge plugin releases the address but keeps
	// its NAT rules, and the firewall plugin needs libcni's cache entry;
	// remove what is still there.
	if err := n.removeLeftovers(ctx, ids, addrsOf(leases, ids)); err != nil {
		return fmt.Errorf("network: detaching %s: %w", id, err)
	}
	n.log.Info("workload detached", "workload", id)
	return nil
}

func portMappings(ports []Port) []gocni.PortMapping {
	out := make([]gocni.PortMapping, 0, len(ports))
	for _, p := range ports {
		out = append(out, gocni.PortMapping{
			HostPort:      int32(p.HostPort),
			ContainerPort: int32(p.ContainerPort),
			Protocol:      p.proto(),
			HostIP:        p.HostIP,
		})
	}
	return out
}

// confList is the CNI configuration of the network: a bridge of
// edgebox's own that is the workloads' gateway and masquerades what they
// send out, host-local addresses kept in the state directory, published
// ports and the firewall plugin's forwarding rules.
func confList(cfg Config) ([]byte, error) {
	type obj = map[string]any
	conf := obj{
		"cniVersion": "1.0.0",
		"name":       cfg.Name,
		"plugins": []obj{
			{
				"type":        "bridge",
				"bridge":      cfg.Bridge,
				"isGateway":   true,
				"ipMasq":      true,
				"hairpinMode": true,
				"ipam": obj{
					"type":    "host-local",
					"ranges":  [][]obj{{{"subnet": cfg.Subnet}}},
					"routes":  []obj{{"dst": "0.0.0.0/0"}},
					"dataDir": ipamDir(cfg),
				},
			},
			{"type": "portmap", "capabilities": obj{"portMappings": true}, "snat": true},
			{"type": "firewall"},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

func ipamDir(cfg Config) string { return filepath.Join(cfg.StateDir, "ipam") }

func findPlugin(dirs []string, name string) string {
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// enableForwarding turns on IPv4 forwarding, which NAT and published
// ports need; the bridge plugin does too, but only when it makes the
// bridge.
func enableForwarding() error {
	const path = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("network: enabling IPv4 forwarding: %w", err)
	}
	return nil
}

// errNotExist reports whether err says a file is missing.
func errNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// parseAddr is the address s, or the zero Addr.
func parseAddr(s string) netip.Addr {
	a, _ := netip.ParseAddr(s)
	return a
}
