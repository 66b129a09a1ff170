//go:build linux || windows

package qemu

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// dhcpMsg builds a client's message: the fixed part, then opts as given
// (code, length, value...), then the end option.
func dhcpMsg(xid uint32, mac net.HardwareAddr, ciaddr string, opts ...byte) []byte {
	b := make([]byte, dhcpHeader)
	b[0], b[1], b[2] = 1, 1, 6
	binary.BigEndian.PutUint32(b[4:8], xid)
	binary.BigEndian.PutUint16(b[10:12], 0x8000)
	if ciaddr != "" {
		a := netip.MustParseAddr(ciaddr).As4()
		copy(b[12:16], a[:])
	}
	copy(b[28:34], mac)
	copy(b[236:240], dhcpCookie)
	return append(append(b, opts...), optEnd)
}

// dhcpReply is what a client reads of an answer.
type dhcpReply struct {
	typ                  byte
	yiaddr, router, mask string
	serverID             string
	dns                  []string
}

func readReply(t *testing.T, b []byte) dhcpReply {
	t.Helper()
	if len(b) < 300 || b[0] != 2 || string(b[236:240]) != string(dhcpCookie) {
		t.Fatalf("not a BOOTREPLY: % x", b)
	}
	r := dhcpReply{yiaddr: netip.AddrFrom4([4]byte(b[16:20])).String()}
	for o := b[dhcpHeader:]; len(o) > 0 && o[0] != optEnd; {
		if o[0] == optPad {
			o = o[1:]
			continue
		}
		code, val := o[0], o[2:2+int(o[1])]
		switch code {
		case optType:
			r.typ = val[0]
		case optRouter:
			r.router = netip.AddrFrom4([4]byte(val)).String()
		case optMask:
			r.mask = net.IP(val).String()
		case optServerID:
			r.serverID = netip.AddrFrom4([4]byte(val)).String()
		case optDNS:
			for i := 0; i+4 <= len(val); i += 4 {
				r.dns = append(r.dns, netip.AddrFrom4([4]byte(val[i:i+4])).String())
			}
		}
		o = o[2+len(val):]
	}
	return r
}

// dhcpCases are the messages a VM's DHCP server meets; they seed the
// fuzz target too.
var dhcpCases = []struct {
	name string
	msg  []byte
	ok   bool // parses
	want *dhcpReply
}{
	{"discover", dhcpMsg(1, MAC("robot"), "", optType, 1, dhcpDiscover), true,
		&dhcpReply{typ: dhcpOffer, yiaddr: "10.234.0.7", router: "10.234.0.1", mask: "255.255.255.0", serverID: "10.234.0.1", dns: []string{"192.0.2.53"}}},
	{"request", dhcpMsg(2, MAC("robot"), "", optType, 1, dhcpRequest, optRequested, 4, 10, 234, 0, 7, optServerID, 4, 10, 234, 0, 1), true,
		&dhcpReply{typ: dhcpAck, yiaddr: "10.234.0.7", router: "10.234.0.1", mask: "255.255.255.0", serverID: "10.234.0.1", dns: []string{"192.0.2.53"}}},
	{"renew", dhcpMsg(3, MAC("robot"), "10.234.0.7", optType, 1, dhcpRequest), true,
		&dhcpReply{typ: dhcpAck, yiaddr: "10.234.0.7", router: "10.234.0.1", mask: "255.255.255.0", serverID: "10.234.0.1", dns: []string{"192.0.2.53"}}},
	{"request of another address", dhcpMsg(4, MAC("robot"), "", optType, 1, dhcpRequest, optRequested, 4, 10, 234, 0, 9), true,
		&dhcpReply{typ: dhcpNak, yiaddr: "0.0.0.0", serverID: "10.234.0.1"}},
	{"another server chosen", dhcpMsg(5, MAC("robot"), "", optType, 1, dhcpRequest, optRequested, 4, 10, 234, 0, 7, optServerID, 4, 10, 0, 0, 1), true, nil},
	{"another MAC", dhcpMsg(6, MAC("other"), "", optType, 1, dhcpDiscover), true, nil},
	{"release", dhcpMsg(7, MAC("robot"), "10.234.0.7", optType, 1, 7), true, nil},
	{"padded options", dhcpMsg(8, MAC("robot"), "", optPad, optPad, optType, 1, dhcpDiscover), true,
		&dhcpReply{typ: dhcpOffer, yiaddr: "10.234.0.7", router: "10.234.0.1", mask: "255.255.255.0", serverID: "10.234.0.1", dns: []string{"192.0.2.53"}}},
	{"no type", dhcpMsg(9, MAC("robot"), ""), false, nil},
	{"option past the end", dhcpMsg(10, MAC("robot"), "", optType, 200, 1), false, nil},
	{"truncated", dhcpMsg(11, MAC("robot"), "", optType, 1, dhcpDiscover)[:100], false, nil},
	{"a reply", append([]byte{2}, dhcpMsg(12, MAC("robot"), "", optType, 1, dhcpOffer)[1:]...), false, nil},
	{"empty", nil, false, nil},
}

var testGuest = guestNet{Addr: netip.MustParsePrefix("10.234.0.7/24"), Gateway: netip.MustParseAddr("10.234.0.1"),
	DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("2001:db8::53")}}

// TestDHCPAnswer: a VM's server offers and acknowledges the VM's address
// with its gateway, mask and DNS, refuses another, and says nothing to
// other MACs, other servers' clients or what it does not parse.
func TestDHCPAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range dhcpCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := parseDHCP(tc.msg)
			if (err == nil) != tc.ok {
				t.Fatalf("parseDHCP: %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				return
			}
			reply, ok := dhcpAnswer(m, MAC("robot"), testGuest)
			if ok != (tc.want != nil) {
				t.Fatalf("answered %v, want %v", ok, tc.want != nil)
			}
			if !ok {
				return
			}
			got := readReply(t, reply)
			if binary.BigEndian.Uint32(reply[4:8]) != m.xid || string(reply[28:34]) != string(MAC("robot")) {
				t.Errorf("the reply's xid or chaddr is not the request's")
			}
			if got.typ != tc.want.typ || got.yiaddr != tc.want.yiaddr || got.router != tc.want.router || got.mask != tc.want.mask ||
				got.serverID != tc.want.serverID || len(got.dns) != len(tc.want.dns) || (len(got.dns) > 0 && got.dns[0] != tc.want.dns[0]) {
				t.Errorf("reply %+v, want %+v", got, *tc.want)
			}
		})
	}
}

// FuzzDHCP: no message a guest sends makes the server panic, and every
// answer is a well-formed reply to the VM's MAC.
func FuzzDHCP(f *testing.F) {
	for _, tc := range dhcpCases {
		f.Add(tc.msg)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseDHCP(b)
		if err != nil {
			return
		}
		if reply, ok := dhcpAnswer(m, MAC("robot"), testGuest); ok {
			if len(reply) < 300 || reply[0] != 2 || string(reply[28:34]) != string(MAC("robot")) {
				t.Fatalf("bad reply % x", reply)
			}
		}
	})
}

// TestIPUDP: the headers of a raw reply carry lengths and checksums a
// receiver verifies (a header summed with its checksum is 0xffff).
func TestIPUDP(t *testing.T) {
	t.Parallel()
	for _, payload := range [][]byte{nil, []byte("x"), make([]byte, 300), []byte("odd length!")} {
		p := ipUDP(netip.MustParseAddr("10.234.0.1"), netip.MustParseAddr("255.255.255.255"), 67, 68, payload)
		if len(p) != 28+len(payload) || binary.BigEndian.Uint16(p[2:4]) != uint16(len(p)) || p[9] != 17 {
			t.Fatalf("header % x", p[:28])
		}
		if got := checksum(0, p[:20]); got != 0xffff {
			t.Errorf("IP header sums to %#x", got)
		}
		sum := checksum(0, p[12:20])
		sum = checksum(sum, []byte{0, 17, p[24], p[25]})
		if got := checksum(sum, p[20:]); got != 0xffff {
			t.Errorf("UDP with its pseudo-header sums to %#x (payload %d bytes)", got, len(payload))
		}
		if string(p[28:]) != string(payload) || binary.BigEndian.Uint16(p[22:24]) != 68 {
			t.Errorf("payload or port wrong")
		}
	}
}
