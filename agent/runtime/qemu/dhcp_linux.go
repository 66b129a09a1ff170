package qemu

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent/network"
)

// dhcpScan is how often Run looks for bridged VMs to answer: a guest
// that asks before its server is up asks again (udhcpc every 3 s,
// Windows within seconds).
const dhcpScan = time.Second

// Run answers the DHCP requests of the bridged VMs until ctx ends, and
// then returns once every server has stopped. It also applies again the
// egress policies of VMs an earlier agent started. Each VM is served by a
// socket of its own inside its namespace, on the bridge that joins its
// tap: started when the VM is attached, stopped when it is not (or its
// namespace was made anew). Without a Network it only waits for ctx.
func (d *Driver) Run(ctx context.Context) error {
	if d.cfg.Network == nil {
		<-ctx.Done()
		return nil
	}
	servers := map[string]*dhcpServer{} // by VM name; Run's goroutine only
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	tick := time.NewTicker(dhcpScan)
	defer tick.Stop()
	for {
		d.scanDHCP(ctx, servers)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// dhcpServer answers one VM.
type dhcpServer struct {
	addr string         // the VM's address, as recorded
	ino  uint64         // its namespace's inode: a new namespace needs a new socket
	conn net.PacketConn // reads requests on the namespace's bridge
	raw  int            // AF_PACKET socket on the tap, for answers
	done chan struct{}  // closed when serve returns (and raw is closed)
}

func (s *dhcpServer) stop() {
	s.conn.Close()
	<-s.done
}

// scanDHCP starts servers for the bridged VMs that have none and stops
// those of VMs gone or attached anew.
func (d *Driver) scanDHCP(ctx context.Context, servers map[string]*dhcpServer) {
	want := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "vms"))
	for _, e := range ents {
		in, err := d.load(e.Name())
		if err != nil || in.Net == nil || in.Net.Mode != netBridge || in.Net.Addr == "" {
			continue
		}
		ns := d.cfg.Network.NetnsPath(netID(in.Name))
		var st unix.Stat_t
		if unix.Stat(ns, &st) != nil {
			continue
		}
		if d.pid(in.Name) != 0 {
			d.ensureEgress(ctx, in)
		}
		if s, ok := servers[in.Name]; ok {
			select {
			case <-s.done:
			default:
				if s.addr == in.Net.Addr && s.ino == st.Ino {
					want[in.Name] = true
					continue
				}
			}
			s.stop()
			delete(servers, in.Name)
		}
		s, err := d.serveDHCP(in, ns, st.Ino)
		if err != nil {
			// The tap is not made yet, or the namespace is going.
			d.log.Debug("no DHCP server for a VM yet", "vm", in.Name, "err", err)
			continue
		}
		servers[in.Name], want[in.Name] = s, true
	}
	for name, s := range servers {
		if !want[name] {
			s.stop()
			delete(servers, name)
		}
	}
}

// htons is v in network byte order, as AF_PACKET takes its protocol.
func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// serveDHCP opens VM in's server in its namespace ns and starts it.
func (d *Driver) serveDHCP(in instance, ns string, ino uint64) (*dhcpServer, error) {
	g := guestNet{DNS: d.guestDNS()}
	var err error
	if g.Addr, err = netip.ParsePrefix(in.Net.Addr); err != nil {
		return nil, err
	}
	if g.Gateway, err = netip.ParseAddr(in.Net.Gateway); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, network.TapBridge); serr != nil {
				return
			}
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1); serr != nil {
				return
			}
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	// Requests are read from the namespace's bridge; answers go straight
	// into the tap as raw IP packets from the gateway's address, so that
	// none goes out to the box's bridge, where it would be one more
	// packet an egress policy refuses.
	var conn net.PacketConn
	var raw int
	var to unix.SockaddrLinklayer
	if err := network.InNetns(ns, func() (err error) {
		tap, err := net.InterfaceByName(network.TapName)
		if err != nil {
			return err
		}
		raw, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		if err != nil {
			return err
		}
		to = unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: tap.Index, Halen: 6}
		copy(to.Addr[:], MAC(in.Name))
		if conn, err = lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:67"); err != nil {
			unix.Close(raw)
		}
		return err
	}); err != nil {
		return nil, err
	}
	s := &dhcpServer{addr: in.Net.Addr, ino: ino, conn: conn, raw: raw, done: make(chan struct{})}
	mac, log := MAC(in.Name), d.log.With("vm", in.Name)
	go func() {
		defer close(s.done)
		defer unix.Close(raw)
		bcast := netip.AddrFrom4([4]byte{255, 255, 255, 255})
		buf := make([]byte, maxDHCP+1)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return // closed by stop
			}
			m, err := parseDHCP(buf[:n])
			if err != nil {
				continue
			}
			reply, ok := dhcpAnswer(m, mac, g)
			if !ok {
				continue
			}
			if err := unix.Sendto(raw, ipUDP(g.Gateway, bcast, 67, 68, reply), 0, &to); err != nil {
				log.Warn("answering a VM's DHCP request", "err", err)
				continue
			}
			log.Debug("answered a VM's DHCP request", "type", m.msgType, "ip", g.Addr)
		}
	}()
	return s, nil
}
