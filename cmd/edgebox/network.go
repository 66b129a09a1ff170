package main

import (
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/edgebox/edgebox/api"
)

// Help for the networking flags of 'edgebox release create'.
const (
	networkHelp = `how the workload reaches the network: bridge (default: edgebox's bridge with NAT),
host (the box's own network; containerd only), user (QEMU user-mode; qemu only)
or none (loopback only); e.g. --network host`
	publishHelp = `publish a port on the box: [IP:]HOST:PORT[/udp], repeatable; HOST on the box
reaches PORT in the workload, on IP only if given (IPv4); e.g. --publish 8080:80
--publish 127.0.0.1:5353:53/udp (bridge and user networks)`
	egressHelp = `allow connections only to this DNS name, IPv4 address or CIDR prefix, repeatable;
names are followed as their addresses change; "any" (alone) allows everything,
as does giving none; e.g. --egress bank.example.com --egress 203.0.113.0/24`
	proxyEnvHelp = `pass the box's proxy to a container as HTTPS_PROXY and HTTP_PROXY (not to VMs: give the guest its proxy in the image)`
)

// parsePublish reads [IP:]HOST:PORT[/PROTO]: "8080:80",
// "127.0.0.1:5353:53/udp".
func parsePublish(s string) (api.Port, error) {
	bad := func(why string) (api.Port, error) {
		return api.Port{}, fmt.Errorf("--publish %q: %s; write [IP:]HOST:PORT[/udp], e.g. 8080:80 or 127.0.0.1:5353:53/udp", s, why)
	}
	spec, proto, hasProto := strings.Cut(s, "/")
	if hasProto && proto != "tcp" && proto != "udp" {
		return bad("the protocol is tcp or udp")
	}
	if strings.HasPrefix(spec, "[") {
		return bad("IPv6 is not supported")
	}
	parts := strings.Split(spec, ":")
	var ip string
	switch len(parts) {
	case 2:
	case 3:
		ip = parts[0]
		a, err := netip.ParseAddr(ip)
		if err != nil || !a.Is4() || a.Zone() != "" {
			return bad(fmt.Sprintf("%q is not an IPv4 address", ip))
		}
		parts = parts[1:]
	default:
		if len(parts) > 3 {
			return bad("IPv6 is not supported")
		}
		return bad("give the box's port and the workload's")
	}
	hostPort, err := strconv.ParseUint(parts[0], 10, 16)
	if err != nil || hostPort == 0 {
		return bad(fmt.Sprintf("host port %q is not from 1 to 65535", parts[0]))
	}
	port, err := strconv.ParseUint(parts[1], 10, 16)
	if err != nil || port == 0 {
		return bad(fmt.Sprintf("port %q is not from 1 to 65535", parts[1]))
	}
	return api.Port{Port: uint16(port), Protocol: proto, HostPort: int(hostPort), HostIP: ip}, nil
}

// publishedString writes p as --publish takes it.
func publishedString(p api.Port) string {
	proto := p.Protocol
	if proto == "" {
		proto = "tcp"
	}
	s := fmt.Sprintf("%d:%d/%s", p.HostPort, p.Port, proto)
	if p.HostIP != "" {
		s = p.HostIP + ":" + s
	}
	return s
}

// networkSummary is one line saying how a release reaches the network,
// or "" when it asks for nothing beyond the default.
func networkSummary(s api.ReleaseSpec) string {
	var parts []string
	if s.Network != "" {
		parts = append(parts, "network "+s.Network)
	}
	var pub []string
	for _, p := range s.Ports {
		if p.HostPort != 0 {
			pub = append(pub, publishedString(p))
		}
	}
	if len(pub) > 0 {
		parts = append(parts, "publishes "+strings.Join(pub, ", "))
	}
	switch {
	case len(s.Egress) == 1 && s.Egress[0] == "any":
		parts = append(parts, "egress any")
	case len(s.Egress) > 0:
		parts = append(parts, "egress only to "+strings.Join(s.Egress, ", "))
	}
	if s.ProxyEnv {
		parts = append(parts, "the box's proxy in HTTPS_PROXY")
	}
	return strings.Join(parts, "; ")
}

// appStatusTable is 'edgebox status APP': one line per box, with the
// workload's address and published ports, and a column of connections
// its egress policy refused when any box counts some.
func appStatusTable(w io.Writer, s api.AppStatus) {
	refused := false
	for _, b := range s.Boxes {
		refused = refused || b.EgressRefused > 0
	}
	head := "BOX\tNAME\tONLINE\tDESIRED\tRUNNING\tPHASE\tHEALTH\tADDRESS\tPORTS"
	if refused {
		head += "\tEGRESS REFUSED"
	}
	fmt.Fprintln(w, head+"\tMESSAGE")
	for _, b := range s.Boxes {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", b.BoxID, b.BoxName, yesNo(b.Online), dash(b.DesiredRelease),
			dash(b.RunningRelease), dash(b.Phase), dash(b.Health), dash(b.Address), dash(strings.Join(b.Ports, ",")))
		if refused {
			fmt.Fprintf(w, "\t%d", b.EgressRefused)
		}
		fmt.Fprintf(w, "\t%s\n", b.Message)
	}
}

// networkTable lists the workloads of a box's state that report a
// network: address, published ports and refused connections.
func networkTable(w io.Writer, sts []api.ObjectStatus) {
	var rows []api.ObjectStatus
	for _, st := range sts {
		if st.Address != "" || len(st.Ports) > 0 || st.EgressRefused > 0 {
			rows = append(rows, st)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nWORKLOAD\tADDRESS\tPORTS\tEGRESS REFUSED")
	for _, st := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\n", st.Name, dash(st.Address), dash(strings.Join(st.Ports, ",")), st.EgressRefused)
	}
}
