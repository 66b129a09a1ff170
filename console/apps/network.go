package apps

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/edgebox/edgebox/console/fleet"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Network modes a release may ask for (Spec.Network, Workload.network).
const (
	NetworkBridge = "bridge" // edgebox's bridge with NAT; "" means the same
	NetworkHost   = "host"   // the box's own network; containerd only
	NetworkUser   = "user"   // QEMU's user-mode network; qemu only
	NetworkNone   = "none"   // loopback only
)

// EgressAny, alone in Spec.Egress, allows every destination, as an empty
// list does.
const EgressAny = "any"

// MaxEgress bounds a release's egress list.
const MaxEgress = 256

// validateNetwork says what is wrong with s's network mode, published
// ports and egress, one error per problem.
func validateNetwork(s Spec) []error {
	var errs []error
	network := s.Network
	switch network {
	case "", NetworkBridge, NetworkNone:
	case NetworkHost:
		if s.Runtime == edgeboxv1.RuntimeQEMU {
			errs = append(errs, errors.New(`network "host": only for containerd releases; a VM uses "bridge" or "user"`))
		}
	case NetworkUser:
		if s.Runtime == edgeboxv1.RuntimeContainerd {
			errs = append(errs, errors.New(`network "user": only for qemu releases (QEMU's user-mode network); a container uses "bridge", "host" or "none"`))
		}
	default:
		errs = append(errs, fmt.Errorf("network %q: use bridge (the default), host (containerd), user (qemu) or none", clipText(network, 20)))
		network = "" // judge the rest as if the default
	}
	published := publishedPorts(s.Ports)
	if s.Runtime == edgeboxv1.RuntimeProcess {
		var set []string
		if s.Network != "" {
			set = append(set, "network")
		}
		if len(published) > 0 {
			set = append(set, "published ports (host_port)")
		}
		if len(s.Egress) > 0 {
			set = append(set, "egress")
		}
		if s.ProxyEnv {
			set = append(set, "proxy_env")
		}
		if len(set) > 0 {
			errs = append(errs, fmt.Errorf("%s: a process release runs on the box's own network; these apply to containerd and qemu releases only",
				strings.Join(set, ", ")))
		}
		return errs
	}
	if len(published) > 0 && (network == NetworkHost || network == NetworkNone) {
		errs = append(errs, fmt.Errorf("published ports (host_port) with network %q: only bridge and user networks publish ports; with host the app's ports are the box's already", network))
	}
	errs = append(errs, validatePublished(s.Ports)...)
	if len(s.Egress) > 0 && !isAny(s.Egress) && (network == NetworkHost || network == NetworkNone || network == NetworkUser) {
		errs = append(errs, fmt.Errorf("egress with network %q: an egress policy is enforced on edgebox's bridge only; use network bridge, or egress any", network))
	}
	errs = append(errs, validateEgress(s.Egress)...)
	if s.ProxyEnv && s.Runtime == edgeboxv1.RuntimeQEMU {
		errs = append(errs, errors.New("proxy_env: a VM has no environment the box can set; give its guest the proxy in the image"))
	}
	return errs
}

// publishedPorts are the ports of ps published on the box.
func publishedPorts(ps []Port) []Port {
	var out []Port
	for _, p := range ps {
		if p.HostPort != 0 || p.HostIP != "" {
			out = append(out, p)
		}
	}
	return out
}

func (p Port) proto() string {
	if p.Protocol == "" {
		return "tcp"
	}
	return p.Protocol
}

// published writes p as the CLI takes it: [ip:]host:port/proto.
func (p Port) published() string {
	s := fmt.Sprintf("%d:%d/%s", p.HostPort, p.Port, clipText(p.proto(), 10))
	if p.HostIP != "" {
		s = clipText(p.HostIP, 40) + ":" + s
	}
	return s
}

// validatePublished checks each published port's host side, and that no
// two publish the same host port and protocol on addresses that overlap
// (the same address, or either on every address).
func validatePublished(ps []Port) []error {
	var errs []error
	type key struct {
		port  int
		proto string
	}
	seen := map[key][]string{}
	for _, p := range ps {
		if p.HostPort == 0 && p.HostIP == "" {
			continue
		}
		if p.HostPort < 1 || p.HostPort > 65535 {
			errs = append(errs, fmt.Errorf("port %s: host port %d is not from 1 to 65535", p.published(), p.HostPort))
			continue
		}
		if p.HostIP != "" {
			a, err := netip.ParseAddr(p.HostIP)
			switch {
			case err != nil || a.Zone() != "":
				errs = append(errs, fmt.Errorf("port %s: host_ip %q is not an IP address; give one of the box's IPv4 addresses, or none for all", p.published(), clipText(p.HostIP, 40)))
				continue
			case !a.Is4():
				errs = append(errs, fmt.Errorf("port %s: host_ip %q: IPv6 is not supported; give one of the box's IPv4 addresses, or none for all", p.published(), clipText(p.HostIP, 40)))
				continue
			}
		}
		k := key{p.HostPort, p.proto()}
		for _, ip := range seen[k] {
			if ip == "" || p.HostIP == "" || ip == p.HostIP {
				errs = append(errs, fmt.Errorf("port %s: host port %d/%s is published twice", p.published(), p.HostPort, k.proto))
				break
			}
		}
		seen[k] = append(seen[k], p.HostIP)
	}
	return errs
}

func isAny(egress []string) bool { return len(egress) == 1 && strings.EqualFold(egress[0], EgressAny) }

// validateEgress checks an egress list: "any" alone, or at most MaxEgress
// DNS names, IPv4 addresses and IPv4 prefixes.
func validateEgress(egress []string) []error {
	if len(egress) > MaxEgress {
		return []error{fmt.Errorf("egress: %d entries; at most %d", len(egress), MaxEgress)}
	}
	if isAny(egress) {
		return nil
	}
	var errs []error
	for _, e := range egress {
		if strings.EqualFold(e, EgressAny) {
			errs = append(errs, errors.New(`egress: "any" allows everything, so it must be the only entry`))
			continue
		}
		if err := ValidEgress(e); err != nil {
			errs = append(errs, err)
		}
		if len(errs) >= 8 {
			errs = append(errs, errors.New("egress: more entries may be wrong; fix these first"))
			break
		}
	}
	return errs
}

// ValidEgress says what is wrong with one egress entry: a DNS name
// (bank.example.com), an IPv4 address (203.0.113.7) or an IPv4 prefix
// with no host bits (203.0.113.0/24).
func ValidEgress(e string) error {
	shown := clipText(e, 60)
	if strings.Contains(e, "://") {
		return fmt.Errorf("egress %q: give a DNS name, an IPv4 address or a CIDR prefix, with no scheme or port", shown)
	}
	if strings.Contains(e, "/") {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return fmt.Errorf("egress %q: not a CIDR prefix; write 203.0.113.0/24", shown)
		}
		if !p.Addr().Is4() {
			return fmt.Errorf("egress %q: IPv6 is not supported; give IPv4 prefixes", shown)
		}
		if p.Bits() == 0 {
			return fmt.Errorf("egress %q: allows every destination; write %q", shown, EgressAny)
		}
		if err := egressAddr(p.Addr()); err != nil {
			return fmt.Errorf("egress %q: %v", shown, err)
		}
		if m := p.Masked(); m != p {
			return fmt.Errorf("egress %q: has host bits set; the prefix is %s", shown, m)
		}
		return nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		if !a.Is4() {
			return fmt.Errorf("egress %q: IPv6 is not supported; give IPv4 addresses", shown)
		}
		if err := egressAddr(a); err != nil {
			return fmt.Errorf("egress %q: %v", shown, err)
		}
		return nil
	}
	if strings.Contains(e, ":") {
		return fmt.Errorf("egress %q: give a DNS name, an IPv4 address or a CIDR prefix, with no scheme or port (IPv6 is not supported)", shown)
	}
	if err := validDNSName(e); err != nil {
		return fmt.Errorf("egress %q: %v", shown, err)
	}
	return nil
}

// egressAddr refuses IPv4 addresses no rule could usefully allow, as
// the box does.
func egressAddr(a netip.Addr) error {
	switch {
	case a.IsUnspecified():
		return errors.New("the unspecified address is no destination")
	case a.IsLoopback():
		return errors.New("a workload's own loopback is always reachable and needs no entry")
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return errors.New("not a unicast destination")
	}
	return nil
}

// validDNSName checks a host name as RFC 1123 writes it: dot-separated
// labels of letters, digits and '-', not starting or ending with '-',
// 1-63 bytes each, 253 in all, and a last label that is not all digits
// (that would be a mistyped address).
func validDNSName(name string) error {
	if name == "" {
		return errors.New("empty; give a DNS name, an IPv4 address or a CIDR prefix")
	}
	if len(name) > 253 {
		return errors.New("a DNS name is at most 253 characters")
	}
	if strings.HasPrefix(name, "*") {
		return errors.New("wildcards cannot be followed as addresses change; list each name")
	}
	name = strings.TrimSuffix(name, ".") // a fully qualified name
	if name == "" {
		return errors.New("give a DNS name, an IPv4 address or a CIDR prefix")
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return errors.New("each part between dots is 1 to 63 characters")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return errors.New("a part between dots cannot start or end with '-'")
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return errors.New("a DNS name has only letters, digits, '-' and dots; give a DNS name, an IPv4 address or a CIDR prefix, with no scheme or port")
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return errors.New("not an IPv4 address, nor a DNS name (its last part is all digits)")
	}
	return nil
}

// portMappings are the ports the workload publishes on the box.
func portMappings(ps []Port) []*edgeboxv1.PortMapping {
	var out []*edgeboxv1.PortMapping
	for _, p := range publishedPorts(ps) {
		out = append(out, &edgeboxv1.PortMapping{Port: uint32(p.Port), HostPort: uint32(p.HostPort), Protocol: p.Protocol, HostIp: p.HostIP})
	}
	return out
}

// egressRules is the egress list as the box takes it: empty allows
// everything. Names keep the case the operator wrote; the box compares
// them in lower case.
func egressRules(egress []string) []string {
	if len(egress) == 0 || isAny(egress) {
		return nil
	}
	return slices.Clone(egress)
}

// hostPortClashes says, for box b running the releases rels (by app),
// where app's published ports take a host port and protocol another app
// publishes on an overlapping address. The box would refuse the second;
// the console says so before it is deployed.
func hostPortClashes(b fleet.Box, app string, rels map[string]Release) []string {
	mine, ok := rels[app]
	if !ok {
		return nil
	}
	var out []string
	others := make([]string, 0, len(rels))
	for other := range rels {
		if other != app {
			others = append(others, other)
		}
	}
	sort.Strings(others)
	for _, p := range publishedPorts(mine.Ports) {
		for _, other := range others {
			for _, q := range publishedPorts(rels[other].Ports) {
				if p.HostPort == q.HostPort && p.proto() == q.proto() && (p.HostIP == "" || q.HostIP == "" || p.HostIP == q.HostIP) {
					name := b.Name
					if name == "" {
						name = b.ID
					}
					out = append(out, fmt.Sprintf("on box %s, %s@%s would publish host port %d/%s, which %s@%s publishes",
						name, app, mine.Version, p.HostPort, p.proto(), other, rels[other].Version))
				}
			}
		}
	}
	return out
}
