package network

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
)

// Port is a workload's port published on the box.
type Port struct {
	// HostPort is the box's port, 1 to 65535.
	HostPort int
	// ContainerPort is the workload's port, 1 to 65535.
	ContainerPort int
	// Protocol is "tcp" or "udp"; empty means tcp.
	Protocol string
	// HostIP, when set, publishes on that IPv4 address of the box only.
	HostIP string
}

// String is "[hostIP:]hostPort->containerPort/proto".
func (p Port) String() string {
	host := fmt.Sprint(p.HostPort)
	if p.HostIP != "" {
		host = p.HostIP + ":" + host
	}
	return fmt.Sprintf("%s->%d/%s", host, p.ContainerPort, p.proto())
}

func (p Port) proto() string {
	if p.Protocol == "" {
		return "tcp"
	}
	return p.Protocol
}

// Validate says what is wrong with p, as an errdefs.ErrInvalid error.
func (p Port) Validate() error {
	if p.HostPort < 1 || p.HostPort > 65535 {
		return errdefs.Invalid("port %s: host port %d is not from 1 to 65535", p, p.HostPort)
	}
	if p.ContainerPort < 1 || p.ContainerPort > 65535 {
		return errdefs.Invalid("port %s: container port %d is not from 1 to 65535", p, p.ContainerPort)
	}
	switch p.Protocol {
	case "", "tcp", "udp":
	default:
		return errdefs.Invalid("port %s: protocol %q: want tcp or udp", p, p.Protocol)
	}
	if p.HostIP != "" {
		a, err := netip.ParseAddr(p.HostIP)
		if err != nil || a.Zone() != "" {
			return errdefs.Invalid("port %s: host address %q is not an IP address", p, p.HostIP)
		}
		if !a.Is4() {
			return errdefs.Invalid("port %s: host address %q: only IPv4 is supported", p, p.HostIP)
		}
	}
	return nil
}

// ValidatePorts checks each port and that no two publish the same host
// port and protocol on overlapping addresses.
func ValidatePorts(ports []Port) error {
	type key struct {
		port  int
		proto string
	}
	seen := map[key][]string{}
	for _, p := range ports {
		if err := p.Validate(); err != nil {
			return err
		}
		k := key{p.HostPort, p.proto()}
		for _, ip := range seen[k] {
			if ip == "" || p.HostIP == "" || ip == p.HostIP {
				return errdefs.Invalid("port %s: host port %d/%s is published twice", p, p.HostPort, k.proto)
			}
		}
		seen[k] = append(seen[k], p.HostIP)
	}
	return nil
}

// ParsePort reads "[hostIP:]hostPort:containerPort[/proto]", the form
// releases and the CLI use, e.g. "8080:80" or "127.0.0.1:5353:53/udp".
func ParsePort(s string) (Port, error) {
	var p Port
	rest, proto, ok := strings.Cut(s, "/")
	if ok {
		p.Protocol = proto
		if proto == "" {
			return Port{}, errdefs.Invalid("port %q: empty protocol after '/'", s)
		}
	}
	parts := strings.Split(rest, ":")
	switch len(parts) {
	case 2:
	case 3:
		p.HostIP = parts[0]
		parts = parts[1:]
	default:
		return Port{}, errdefs.Invalid("port %q: want [hostIP:]hostPort:containerPort[/tcp|udp]", s)
	}
	var err error
	if p.HostPort, err = parsePortNumber(parts[0]); err != nil {
		return Port{}, errdefs.Invalid("port %q: host port %q is not a number", s, parts[0])
	}
	if p.ContainerPort, err = parsePortNumber(parts[1]); err != nil {
		return Port{}, errdefs.Invalid("port %q: container port %q is not a number", s, parts[1])
	}
	if err := p.Validate(); err != nil {
		return Port{}, err
	}
	return p, nil
}

func parsePortNumber(s string) (int, error) {
	if s == "" || len(s) > 5 {
		return 0, fmt.Errorf("bad port")
	}
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("bad port")
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}
