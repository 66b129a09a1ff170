//go:build linux || windows

package qemu

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// A VM's network, by the workload's network field:
//
//	"" or "bridge"  a virtio NIC on a tap in a namespace of the VM's own,
//	                attached to edgebox's bridge like a container (Linux,
//	                with Config.Network set); user mode where no bridge can
//	                be made (Windows hosts, or no Network)
//	"user"          QEMU's user-mode network: NAT inside QEMU, DHCP from
//	                QEMU (the guest is 10.0.2.15, the host 10.0.2.2),
//	                published ports as hostfwd
//	"none"          no NIC at all
//
// Every NIC has the workload's MAC (MAC), the same for every start and
// release of the workload. A bridged guest gets its address by DHCP from
// the driver (Run serves it, inside the VM's namespace; see dhcp.go), and
// it is also in fw_cfg (opt/edgebox/net, lines ip=A.B.C.D/N, gateway=,
// dns=, mac=) for a guest without a DHCP client. The address is the
// VM's from its first start until it is removed (a reboot of the box may
// change it). Published ports are the workload network's (CNI portmap)
// on the bridge, hostfwd in user mode. An egress policy is enforced on
// the bridge only: a VM on the user network whose release restricts
// egress does not start.
const (
	netBridge = "bridge"
	netUser   = "user"
	netNone   = "none"
)

// netMode is the network a VM gets: its workload's choice, with user mode
// standing in for a bridge the box cannot make.
func netMode(w *edgeboxv1.Workload, haveBridge bool) (string, error) {
	switch m := w.GetNetwork(); m {
	case "", netBridge:
		if haveBridge {
			return netBridge, nil
		}
		return netUser, nil
	case netUser, netNone:
		return m, nil
	case "host":
		return "", errdefs.Invalid("network %q is for containers; a VM takes bridge, user or none", m)
	default:
		return "", errdefs.Invalid("unknown network %q: want bridge, user or none", m)
	}
}

// restrictsEgress says whether w's egress policy allows less than
// everything.
func restrictsEgress(w *edgeboxv1.Workload) bool {
	e := w.GetEgress()
	return len(e) > 0 && !(len(e) == 1 && strings.EqualFold(strings.TrimSpace(e[0]), "any"))
}

// MAC is the MAC address of workload name's NIC: locally administered,
// unicast, and derived from the name alone, so a workload keeps it across
// restarts, new releases and a rebuilt agent (Windows activation and the
// device allow-lists of banks depend on it).
func MAC(name string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("edgebox vm mac\x00" + name))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02 // unicast, locally administered
	return mac
}

// port is a published port of a VM.
type port struct {
	HostPort int    `json:"host_port"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol,omitempty"` // tcp or udp
	HostIP   string `json:"host_ip,omitempty"`
}

func (p port) proto() string {
	if p.Protocol == "" {
		return "tcp"
	}
	return p.Protocol
}

// String is "[host_ip:]host_port:port/protocol", as status shows ports.
func (p port) String() string {
	s := strconv.Itoa(p.HostPort) + ":" + strconv.Itoa(p.Port) + "/" + p.proto()
	if p.HostIP != "" {
		s = p.HostIP + ":" + s
	}
	return s
}

// ports checks the workload's published ports.
func ports(w *edgeboxv1.Workload) ([]port, error) {
	var out []port
	seen := map[string]bool{}
	for _, pm := range w.GetPorts() {
		p := port{HostPort: int(pm.GetHostPort()), Port: int(pm.GetPort()), Protocol: pm.GetProtocol(), HostIP: pm.GetHostIp()}
		if p.HostPort < 1 || p.HostPort > 65535 || p.Port < 1 || p.Port > 65535 {
			return nil, errdefs.Invalid("port %s: ports go from 1 to 65535", p)
		}
		if p.Protocol != "" && p.Protocol != "tcp" && p.Protocol != "udp" {
			return nil, errdefs.Invalid("port %s: protocol %q: want tcp or udp", p, p.Protocol)
		}
		if p.HostIP != "" {
			a, err := netip.ParseAddr(p.HostIP)
			if err != nil || !a.Is4() {
				return nil, errdefs.Invalid("port %s: host address %q is not an IPv4 address", p, p.HostIP)
			}
		}
		key := strconv.Itoa(p.HostPort) + "/" + p.proto()
		if seen[key] {
			return nil, errdefs.Invalid("port %s: host port %s is published twice", p, key)
		}
		seen[key] = true
		out = append(out, p)
	}
	return out, nil
}

// guestNet is what a bridged guest is told of its network.
type guestNet struct {
	Addr    netip.Prefix // its address and the bridge's subnet
	Gateway netip.Addr
	DNS     []netip.Addr
}

// netArgs is QEMU's command line for the VM's NIC. tapFD is the file
// descriptor QEMU finds the tap on (bridge mode).
func netArgs(mode string, mac net.HardwareAddr, ps []port, tapFD int, g guestNet) []string {
	nic := "virtio-net-pci,netdev=n0,mac=" + mac.String()
	switch mode {
	case netBridge:
		a := []string{"-netdev", "tap,id=n0,fd=" + strconv.Itoa(tapFD), "-device", nic}
		lines := []string{"ip=" + g.Addr.String(), "gateway=" + g.Gateway.String(), "mac=" + mac.String()}
		for _, d := range g.DNS {
			lines = append(lines, "dns="+d.String())
		}
		return append(a, "-fw_cfg", "name=opt/edgebox/net,string="+strings.Join(lines, "\n"))
	case netUser:
		netdev := "user,id=n0"
		for _, p := range ps {
			// hostfwd=proto:hostaddr:hostport-guestaddr:guestport; QEMU
			// splits the option on commas, which none of these hold.
			netdev += fmt.Sprintf(",hostfwd=%s:%s:%d-:%d", p.proto(), p.HostIP, p.HostPort, p.Port)
		}
		return []string{"-netdev", netdev, "-device", nic}
	default:
		return nil
	}
}
