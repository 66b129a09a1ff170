//go:build linux

package containerd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent/network"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/atomicfile"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// A container's network, by its Workload.network:
//
//	"" or "bridge"  a network namespace of its own at <NetnsDir>/<name>,
//	                attached to the box's bridge (Config.Network) with
//	                its published ports; the box's resolvers in
//	                <StateDir>/<name>/resolv.conf
//	"host"          the box's own network namespace and resolv.conf
//	"none"          a namespace runc makes, with loopback only
//
// Without Config.Network (no CNI plugins on the box) "bridge" is "none",
// as before edgebox had a network, and publishing ports is refused.
//
// Every container gets <StateDir>/<name>/hosts (localhost and its own
// name). The mode a container got, its address and its ports are labels
// of the container, so Inspect, Remove and a restarted agent know them.

// Network modes, as the labelNetwork label records what a container got.
const (
	modeBridge = "bridge"
	modeHost   = "host"
	modeNone   = "none"
)

// maxPorts bounds the ports one container publishes: they are kept in a
// label, which containerd limits to 4 KiB.
const maxPorts = 64

// netSetup is what Create gives a container of the network.
type netSetup struct {
	mode   string
	netns  string // the namespace's path, for bridge
	ports  []network.Port
	addr   netip.Addr // set by the attach, read after attached
	opts   []oci.SpecOpts
	labels map[string]string
	// attached has the result of the attach that runs while the
	// container is made (bridge); finishNetwork takes it.
	attached chan error
	veth     string          // the box's end of its veth pair, set by the attach
	egress   *network.Egress // its egress policy; nil: none
}

// networkMode is the mode a workload asks for, checked.
func networkMode(w *edgeboxv1.Workload) (string, error) {
	switch m := w.GetNetwork(); m {
	case "", modeBridge:
		return modeBridge, nil
	case modeHost, modeNone:
		return m, nil
	case "user":
		return "", errdefs.Invalid("network %q is for VMs; a container takes bridge, host or none", m)
	default:
		return "", errdefs.Invalid("network %q: want bridge, host or none", m)
	}
}

// workloadPorts converts and checks a workload's published ports.
func workloadPorts(w *edgeboxv1.Workload) ([]network.Port, error) {
	pms := w.GetPorts()
	if len(pms) > maxPorts {
		return nil, errdefs.Invalid("%d published ports: at most %d", len(pms), maxPorts)
	}
	ports := make([]network.Port, 0, len(pms))
	for _, pm := range pms {
		ports = append(ports, network.Port{HostPort: int(pm.GetHostPort()), ContainerPort: int(pm.GetPort()),
			Protocol: pm.GetProtocol(), HostIP: pm.GetHostIp()})
	}
	if err := network.ValidatePorts(ports); err != nil {
		return nil, err
	}
	return ports, nil
}

// portString is the form of a published port in labels and status,
// "[host_ip:]host_port:port/protocol", which network.ParsePort reads.
func portString(p network.Port) string {
	proto := p.Protocol
	if proto == "" {
		proto = "tcp"
	}
	s := fmt.Sprintf("%d:%d/%s", p.HostPort, p.ContainerPort, proto)
	if p.HostIP != "" {
		s = p.HostIP + ":" + s
	}
	return s
}

func portStrings(ports []network.Port) []string {
	out := make([]string, 0, len(ports))
	for _, p := range ports {
		out = append(out, portString(p))
	}
	return out
}

// labelledPorts reads the ports label back; what does not parse is
// dropped (a label is the driver's own, but a box's disk is not trusted).
func labelledPorts(label string) []network.Port {
	var out []network.Port
	for _, s := range strings.Split(label, ",") {
		if p, err := network.ParsePort(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// setupNetwork gives the container of workload name its network, before
// the container is made. A bridged container's namespace is made here
// and attached in the background while containerd makes the container
// (attaching takes the plugins most of a container's start):
// finishNetwork waits for it. On failure nothing of it is left.
func (d *Driver) setupNetwork(ctx context.Context, name string, w *edgeboxv1.Workload) (*netSetup, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\,") {
		return nil, errdefs.Invalid("%q cannot name a container", name)
	}
	mode, err := networkMode(w)
	if err != nil {
		return nil, err
	}
	ports, err := workloadPorts(w)
	if err != nil {
		return nil, err
	}
	egress, err := d.egressOf(w, mode)
	if err != nil {
		return nil, err
	}
	n := d.cfg.Network
	if mode == modeBridge && n == nil {
		if len(ports) > 0 {
			return nil, errdefs.Unavailable("this box has no workload network (the CNI plugins are not installed): ports cannot be published")
		}
		mode = modeNone
	}
	if len(ports) > 0 && mode != modeBridge {
		return nil, errdefs.Invalid("network %s: published ports need network bridge", mode)
	}
	ns := &netSetup{mode: mode, ports: ports, labels: map[string]string{labelNetwork: mode}, egress: egress}
	switch mode {
	case modeHost:
		ns.opts = append(ns.opts, oci.WithHostNamespace(specs.NetworkNamespace))
		if d.cfg.StateDir != "" {
			ns.opts = append(ns.opts, withFile("/etc/resolv.conf", d.cfg.ResolvConf))
		}
	case modeBridge:
		if err := portsFree(ports); err != nil {
			return nil, err
		}
		path, err := network.CreateNetns(n.Config().NetnsDir, name)
		if err != nil {
			return nil, err
		}
		ns.netns = path
		resolv := filepath.Join(d.netDir(name), "resolv.conf")
		if err := os.MkdirAll(d.netDir(name), 0o755); err != nil {
			d.teardown(context.WithoutCancel(ctx), name, ns.ports, "")
			return nil, fmt.Errorf("network files of %s: %w", name, err)
		}
		if err := writeShared(resolv, d.resolvConf(name)); err != nil {
			d.teardown(context.WithoutCancel(ctx), name, ns.ports, "")
			return nil, fmt.Errorf("resolv.conf of %s: %w", name, err)
		}
		if egress != nil {
			if err := d.saveEgress(name, w); err != nil {
				d.teardown(context.WithoutCancel(ctx), name, ns.ports, "")
				return nil, fmt.Errorf("egress of %s: %w", name, err)
			}
		}
		ns.opts = append(ns.opts,
			oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: ns.netns}),
			withFile("/etc/resolv.conf", resolv),
			withFile("/etc/hosts", filepath.Join(d.netDir(name), "hosts")))
		ns.labels[labelPorts] = strings.Join(portStrings(ports), ",")
		ns.attached = make(chan error, 1)
		go func() { ns.attached <- d.attach(ctx, name, ns) }()
		return ns, nil
	}
	if d.cfg.StateDir == "" {
		return ns, nil // a driver without a network (Network requires StateDir)
	}
	hosts := filepath.Join(d.netDir(name), "hosts")
	if err := os.MkdirAll(d.netDir(name), 0o755); err != nil {
		return nil, fmt.Errorf("network files of %s: %w", name, err)
	}
	if err := writeShared(hosts, hostsFile(name, ns.addr)); err != nil {
		d.teardown(context.WithoutCancel(ctx), name, ns.ports, "")
		return nil, fmt.Errorf("hosts file of %s: %w", name, err)
	}
	ns.opts = append(ns.opts, withFile("/etc/hosts", hosts))
	return ns, nil
}

// finishNetwork waits for the attach setupNetwork started, writes the
// hosts file with the container's address and applies its egress
// policy; the address and veth labels are then in ns.labels. The crash
// point create/attached is here: crashed says the crash hook ended it.
func (d *Driver) finishNetwork(ctx context.Context, name string, ns *netSetup) (crashed bool, err error) {
	if ns.attached == nil {
		return false, nil
	}
	err = <-ns.attached
	ns.attached = nil
	if err != nil {
		return false, err
	}
	ns.labels[labelAddress] = ns.addr.String()
	ns.labels[labelVeth] = ns.veth
	if err := d.at("create/attached"); err != nil {
		return true, err
	}
	if err := writeShared(filepath.Join(d.netDir(name), "hosts"), hostsFile(name, ns.addr)); err != nil {
		return false, fmt.Errorf("hosts file of %s: %w", name, err)
	}
	if ns.egress != nil {
		if err := d.applyEgress(ctx, name, ns.addr, ns.veth); err != nil {
			return false, err
		}
	}
	return false, nil
}

// attach attaches the namespace at ns.netns to the bridge. An
// attachment of the name that no container holds is what an agent
// killed between attaching and making the container left: it is
// detached and the name attached again.
func (d *Driver) attach(ctx context.Context, name string, ns *netSetup) error {
	n := d.cfg.Network
	res, err := n.Attach(ctx, name, ns.netns, ns.ports)
	if errors.Is(err, errdefs.ErrConflict) {
		if derr := n.Detach(ctx, name, ns.netns, nil); derr == nil {
			res, err = n.Attach(ctx, name, ns.netns, ns.ports)
		}
	}
	if err != nil {
		return fmt.Errorf("attaching %s to the box's network: %w", name, err)
	}
	ns.addr, ns.veth = res.IP, res.HostInterface
	return nil
}

// teardown undoes setupNetwork, or what a container's network left:
// its attachment, namespace and files. What is gone already is no error.
// crashPoint, when set, is the crash point between detaching and
// removing the namespace (Remove's).
func (d *Driver) teardown(ctx context.Context, name string, ports []network.Port, crashPoint string) error {
	var errs []error
	if p := d.cfg.Egress; p != nil {
		if err := p.Remove(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	if n := d.cfg.Network; n != nil {
		path := n.NetnsPath(name)
		if err := n.Detach(ctx, name, path, ports); err != nil {
			errs = append(errs, err)
		} else {
			if crashPoint != "" {
				if err := d.at(crashPoint); err != nil {
					return err
				}
			}
			if err := network.RemoveNetns(path); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if d.cfg.StateDir != "" {
		if err := os.RemoveAll(d.netDir(name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// hasNetwork says whether something of name's network may be on the
// box: its namespace's mount point or its files.
func (d *Driver) hasNetwork(name string) bool {
	if d.cfg.StateDir == "" {
		return false
	}
	if _, err := os.Stat(d.netDir(name)); err == nil {
		return true
	}
	if n := d.cfg.Network; n != nil {
		if _, err := os.Stat(n.NetnsPath(name)); err == nil {
			return true
		}
	}
	return false
}

// reattach gives a bridged container whose namespace went (the box
// rebooted: namespaces live in a runtime directory) a new one at the
// same path, attached again with its ports, before its task starts; and
// one whose Create was killed before its address was recorded, its
// address. It returns the labels to update.
func (d *Driver) reattach(ctx context.Context, name string, labels map[string]string) (map[string]string, error) {
	n := d.cfg.Network
	path := ""
	if n != nil {
		path = n.NetnsPath(name)
	}
	if labels[labelNetwork] != modeBridge || n == nil || (isNetns(path) && labels[labelAddress] != "") {
		return nil, nil
	}
	ports := labelledPorts(labels[labelPorts])
	// The attachment is stale, or not known: libcni's cache and the
	// address leases outlive a reboot.
	if !isNetns(path) {
		path = ""
	}
	if err := n.Detach(ctx, name, path, ports); err != nil {
		return nil, fmt.Errorf("detaching the old network of %s: %w", name, err)
	}
	if err := portsFree(ports); err != nil {
		return nil, err
	}
	path, err := network.CreateNetns(n.Config().NetnsDir, name)
	if err != nil {
		return nil, err
	}
	ns := &netSetup{ports: ports, netns: path}
	if err := d.attach(ctx, name, ns); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.netDir(name), 0o755); err != nil {
		return nil, err
	}
	if err := writeShared(filepath.Join(d.netDir(name), "resolv.conf"), d.resolvConf(name)); err != nil {
		return nil, err
	}
	if err := writeShared(filepath.Join(d.netDir(name), "hosts"), hostsFile(name, ns.addr)); err != nil {
		return nil, err
	}
	if err := d.applyEgress(ctx, name, ns.addr, ns.veth); err != nil {
		return nil, err
	}
	d.log.Info("container attached again", "workload", name, "ip", ns.addr)
	return map[string]string{labelAddress: ns.addr.String(), labelVeth: ns.veth}, nil
}

// portsFree checks that no program on the box listens on a port a
// container would publish: the published port would take its traffic.
func portsFree(ports []network.Port) error {
	for _, p := range ports {
		addr := net.JoinHostPort(p.HostIP, fmt.Sprint(p.HostPort))
		var err error
		if p.Protocol == "udp" {
			var c net.PacketConn
			if c, err = net.ListenPacket("udp4", addr); err == nil {
				c.Close()
			}
		} else {
			var l net.Listener
			if l, err = net.Listen("tcp4", addr); err == nil {
				l.Close()
			}
		}
		if errors.Is(err, unix.EADDRINUSE) {
			proto := p.Protocol
			if proto == "" {
				proto = "tcp"
			}
			return errdefs.Conflict("port %s: host port %d/%s is in use on the box", portString(p), p.HostPort, proto)
		}
		if err != nil {
			return fmt.Errorf("port %s: checking the host port: %w", portString(p), err)
		}
	}
	return nil
}

// resolvConf is the resolv.conf of a bridged container: the box's
// resolvers. A box whose only resolver is on loopback with no upstream
// known gives its containers none, and says so in the file and the log.
func (d *Driver) resolvConf(name string) []byte {
	b, err := network.ResolvConf(d.cfg.ResolvConf, d.cfg.UpstreamResolvConf)
	if err != nil {
		d.log.Warn("the container gets no DNS server", "workload", name, "err", err)
		return []byte("# edgebox found no DNS server for workloads: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n")
	}
	return b
}

// hostsFile names localhost and the container itself.
func hostsFile(name string, addr netip.Addr) []byte {
	self := "127.0.1.1"
	if addr.IsValid() {
		self = addr.String()
	}
	return fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", self, name)
}

// proxyEnv is the environment that passes the box's proxy to a workload
// that asks for it.
func (d *Driver) proxyEnv(name string) []string {
	if d.cfg.Proxy == "" {
		d.log.Info("the workload asks for the box's proxy, but the box has none", "workload", name)
		return nil
	}
	noProxy := []string{"localhost", "127.0.0.1", "::1"}
	if n := d.cfg.Network; n != nil {
		noProxy = append(noProxy, n.Config().Subnet)
	}
	np := strings.Join(noProxy, ",")
	return []string{"HTTPS_PROXY=" + d.cfg.Proxy, "HTTP_PROXY=" + d.cfg.Proxy, "https_proxy=" + d.cfg.Proxy, "http_proxy=" + d.cfg.Proxy,
		"NO_PROXY=" + np, "no_proxy=" + np}
}

// validProxy checks the proxy URL passed to workloads.
func validProxy(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errdefs.Invalid("containerd: the proxy for workloads is not an http:// or https:// URL")
	}
	return nil
}

// withFile bind-mounts the box's file src read-only at dst.
func withFile(dst, src string) oci.SpecOpts {
	return oci.WithMounts([]specs.Mount{{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "ro"}}})
}

func (d *Driver) netDir(name string) string { return filepath.Join(d.cfg.StateDir, "net", name) }

// isNetns says whether a network namespace is mounted at path.
func isNetns(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// sweepNetwork removes the network of every container that is gone:
// attachments, egress policies, namespaces and files a killed agent
// left; and applies again the egress policies of those that exist.
// containers are the labels of the containers that exist;
// Config.KeepNetwork says which other attachments are held.
func (d *Driver) sweepNetwork(ctx context.Context, containers map[string]map[string]string) ([]string, error) {
	if d.cfg.StateDir == "" {
		return nil, nil
	}
	var gone []string
	seen := map[string]bool{}
	held := func(id string) bool {
		_, ok := containers[id]
		return ok || (d.cfg.KeepNetwork != nil && d.cfg.KeepNetwork(id))
	}
	note := func(name string) {
		if !held(name) && !seen[name] {
			seen[name] = true
			gone = append(gone, name)
		}
	}
	entries, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "net"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("listing network files: %w", err)
	}
	for _, e := range entries {
		note(e.Name())
	}
	var errs []error
	if n := d.cfg.Network; n != nil {
		if entries, err := os.ReadDir(n.Config().NetnsDir); err == nil {
			for _, e := range entries {
				note(e.Name())
			}
		}
		if err := n.Sweep(ctx, held); err != nil {
			errs = append(errs, err)
		}
	}
	if p := d.cfg.Egress; p != nil {
		if err := p.Sweep(ctx, held); err != nil {
			errs = append(errs, err)
		}
		if err := d.reapplyEgress(ctx, containers); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range gone {
		if err := os.RemoveAll(d.netDir(name)); err != nil {
			errs = append(errs, err)
		}
	}
	return gone, errors.Join(errs...)
}

// writeShared writes a file a workload reads (its resolv.conf, hosts and
// egress list), readable by whatever user it runs as.
func writeShared(path string, data []byte) error { return atomicfile.WriteMode(path, data, 0o644) }
