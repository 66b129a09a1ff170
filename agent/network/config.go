package network

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"

	"github.com/edgebox/edgebox/errdefs"
)

// Config says which bridge and subnet workloads get and where the state of
// the network is kept.
type Config struct {
	// Name is the CNI network's name; it prefixes libcni's cache entries
	// and the comments of the iptables rules the plugins write.
	Name string
	// Bridge is the Linux bridge workloads are attached to, at most 15
	// characters.
	Bridge string
	// Subnet is the IPv4 network workloads get addresses from; the bridge
	// takes its first address as the workloads' gateway.
	Subnet string
	// PluginDirs are searched, in order, for the CNI plugin programs.
	PluginDirs []string
	// StateDir holds the network configuration and the address leases; it
	// must outlive the agent's process (the agent's state directory).
	StateDir string
	// NetnsDir holds the workloads' network namespaces (a runtime
	// directory: it empties at reboot, as namespaces do).
	NetnsDir string
}

// DefaultSubnet is the workloads' network unless configured: a /24 in
// 10.234.0.0/16, away from the ranges home and branch routers hand out
// (192.168.x, 10.0.x, 10.1.x), from Docker's 172.17.0.0/16 and from
// containerd's and Podman's 10.88.0.0/16, so a box rarely needs to change
// it.
const DefaultSubnet = "10.234.0.0/24"

// DefaultConfig is edgebox's network; StateDir is still to be set.
func DefaultConfig() Config {
	return Config{
		Name:       "edgebox",
		Bridge:     "edgebox0",
		Subnet:     DefaultSubnet,
		PluginDirs: []string{"/usr/lib/cni", "/opt/cni/bin"},
		NetnsDir:   "/run/edgebox/netns",
	}
}

// namePattern is what CNI allows as a network name and a container ID.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// bridgePattern keeps interface names to characters every tool accepts.
var bridgePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// Validate says what is wrong with c, as an errdefs.ErrInvalid error.
func (c Config) Validate() error {
	if len(c.Name) > 64 || !namePattern.MatchString(c.Name) {
		return errdefs.Invalid("network: name %q: want 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit", c.Name)
	}
	if len(c.Bridge) > 15 || !bridgePattern.MatchString(c.Bridge) {
		return errdefs.Invalid("network: bridge %q: want 1 to 15 letters, digits, '_', '.' or '-'", c.Bridge)
	}
	if _, err := parseSubnet(c.Subnet); err != nil {
		return err
	}
	if len(c.PluginDirs) == 0 {
		return errdefs.Invalid("network: no CNI plugin directory")
	}
	for _, d := range c.PluginDirs {
		if !filepath.IsAbs(d) {
			return errdefs.Invalid("network: CNI plugin directory %q is not an absolute path", d)
		}
	}
	if !filepath.IsAbs(c.StateDir) {
		return errdefs.Invalid("network: state directory %q is not an absolute path", c.StateDir)
	}
	if !filepath.IsAbs(c.NetnsDir) {
		return errdefs.Invalid("network: namespace directory %q is not an absolute path", c.NetnsDir)
	}
	return nil
}

// parseSubnet accepts an IPv4 network from /16 to /29 written with its
// host bits zero, outside loopback, link-local and multicast.
func parseSubnet(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, errdefs.Invalid("network: subnet %q is not a network like %s", s, DefaultSubnet)
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, errdefs.Invalid("network: subnet %q: only IPv4 is supported", s)
	}
	if p.Bits() < 16 || p.Bits() > 29 {
		return netip.Prefix{}, errdefs.Invalid("network: subnet %q: want a prefix length from /16 to /29", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, errdefs.Invalid("network: subnet %q has host bits set; did you mean %s?", s, p.Masked())
	}
	a := p.Addr()
	if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() || !a.IsGlobalUnicast() {
		return netip.Prefix{}, errdefs.Invalid("network: subnet %q is not a unicast network workloads can use", s)
	}
	return p, nil
}

// validID checks a workload id used as a CNI container ID and a file name.
func validID(id string) error {
	if len(id) > 128 || !namePattern.MatchString(id) {
		return errdefs.Invalid("network: workload id %q: want 1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit", id)
	}
	return nil
}

// String is for logs.
func (c Config) String() string {
	return fmt.Sprintf("%s bridge %s subnet %s", c.Name, c.Bridge, c.Subnet)
}
