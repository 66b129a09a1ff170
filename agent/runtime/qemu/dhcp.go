//go:build linux || windows

package qemu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"time"
)

// A bridged VM asks for its address by DHCP (RFC 2131), and the driver
// answers it from inside the VM's namespace with the one address the
// workload network gave it: every guest that does DHCP (Windows, cloud
// images) works unchanged. Only that VM's MAC is answered, only DISCOVER
// and REQUEST, and nothing is kept: the lease is the VM's address for as
// long as the VM exists.

// DHCP message types (option 53).
const (
	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpAck      = 5
	dhcpNak      = 6
)

// DHCP options.
const (
	optPad       = 0
	optMask      = 1
	optRouter    = 3
	optDNS       = 6
	optRequested = 50
	optLeaseTime = 51
	optType      = 53
	optServerID  = 54
	optEnd       = 255
)

// dhcpHeader is the fixed part of a DHCP message, through the magic
// cookie.
const dhcpHeader = 240

// maxDHCP bounds a message read from a guest.
const maxDHCP = 1500

var dhcpCookie = []byte{99, 130, 83, 99}

// leaseTime is what guests are told; they renew at half of it, and the
// answer never changes.
const leaseTime = 24 * time.Hour

// dhcpRequestMsg is what the driver reads of a guest's message.
type dhcpRequestMsg struct {
	xid       uint32
	flags     uint16
	ciaddr    netip.Addr
	chaddr    net.HardwareAddr
	msgType   byte
	requested netip.Addr // option 50, if present
	serverID  netip.Addr // option 54, if present
}

var errNotDHCP = errors.New("not a DHCP request")

// parseDHCP reads a client's message, checking every length it holds.
func parseDHCP(b []byte) (dhcpRequestMsg, error) {
	var m dhcpRequestMsg
	if len(b) < dhcpHeader || len(b) > maxDHCP {
		return m, errNotDHCP
	}
	if b[0] != 1 || b[1] != 1 || b[2] != 6 || !bytes.Equal(b[236:240], dhcpCookie) {
		return m, errNotDHCP // not a BOOTREQUEST over Ethernet
	}
	m.xid = binary.BigEndian.Uint32(b[4:8])
	m.flags = binary.BigEndian.Uint16(b[10:12])
	m.ciaddr = netip.AddrFrom4([4]byte(b[12:16]))
	m.chaddr = net.HardwareAddr(bytes.Clone(b[28:34]))
	opts := b[dhcpHeader:]
	for i := 0; i < len(opts); {
		code := opts[i]
		if code == optEnd {
			break
		}
		if code == optPad {
			i++
			continue
		}
		if i+1 >= len(opts) || i+2+int(opts[i+1]) > len(opts) {
			return m, errors.New("a DHCP option runs past the message")
		}
		val := opts[i+2 : i+2+int(opts[i+1])]
		switch code {
		case optType:
			if len(val) == 1 {
				m.msgType = val[0]
			}
		case optRequested:
			if len(val) == 4 {
				m.requested = netip.AddrFrom4([4]byte(val))
			}
		case optServerID:
			if len(val) == 4 {
				m.serverID = netip.AddrFrom4([4]byte(val))
			}
		}
		i += 2 + len(val)
	}
	if m.msgType == 0 {
		return m, errors.New("a DHCP message without its type")
	}
	return m, nil
}

// dhcpAnswer is the driver's answer to a guest's message for the VM with
// MAC mac and network g, and false where it says nothing (another MAC,
// another server chosen, a message it does not answer). The server is
// named by the guest's gateway, the box's end of the bridge.
func dhcpAnswer(m dhcpRequestMsg, mac net.HardwareAddr, g guestNet) ([]byte, bool) {
	if !bytes.Equal(m.chaddr, mac) || !g.Addr.IsValid() {
		return nil, false
	}
	ip := g.Addr.Addr()
	var typ byte
	switch m.msgType {
	case dhcpDiscover:
		typ = dhcpOffer
	case dhcpRequest:
		if m.serverID.IsValid() && m.serverID != g.Gateway {
			return nil, false // the guest took another server's offer
		}
		want := m.requested
		if !want.IsValid() {
			want = m.ciaddr // renewing
		}
		typ = dhcpAck
		if want != ip {
			typ = dhcpNak
		}
	default:
		return nil, false
	}
	b := make([]byte, dhcpHeader, 300)
	b[0], b[1], b[2] = 2, 1, 6 // BOOTREPLY, Ethernet
	binary.BigEndian.PutUint32(b[4:8], m.xid)
	binary.BigEndian.PutUint16(b[10:12], m.flags)
	if typ != dhcpNak {
		a := ip.As4()
		copy(b[16:20], a[:]) // yiaddr
	}
	copy(b[28:34], mac)
	copy(b[236:240], dhcpCookie)
	opt := func(code byte, val ...byte) { b = append(append(b, code, byte(len(val))), val...) }
	addr := func(a netip.Addr) []byte { v := a.As4(); return v[:] }
	opt(optType, typ)
	opt(optServerID, addr(g.Gateway)...)
	if typ != dhcpNak {
		var lt [4]byte
		binary.BigEndian.PutUint32(lt[:], uint32(leaseTime/time.Second))
		opt(optLeaseTime, lt[:]...)
		mask := net.CIDRMask(g.Addr.Bits(), 32)
		opt(optMask, mask...)
		opt(optRouter, addr(g.Gateway)...)
		var dns []byte
		for _, d := range g.DNS {
			if d.Is4() {
				dns = append(dns, addr(d)...)
			}
		}
		if len(dns) > 0 {
			opt(optDNS, dns...)
		}
	}
	b = append(b, optEnd)
	for len(b) < 300 { // the BOOTP minimum some clients insist on
		b = append(b, optPad)
	}
	return b, true
}

// ipUDP wraps a UDP payload in its UDP and IPv4 headers, checksums
// computed, for a reply sent on the VM's tap as a raw packet.
func ipUDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	const ipLen, udpLen = 20, 8
	b := make([]byte, ipLen+udpLen+len(payload))
	b[0] = 0x45 // IPv4, 20-byte header
	binary.BigEndian.PutUint16(b[2:4], uint16(len(b)))
	b[8], b[9] = 64, 17 // TTL, UDP
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:12], ^checksum(0, b[:ipLen]))
	u := b[ipLen:]
	binary.BigEndian.PutUint16(u[0:2], sport)
	binary.BigEndian.PutUint16(u[2:4], dport)
	binary.BigEndian.PutUint16(u[4:6], uint16(udpLen+len(payload)))
	copy(u[udpLen:], payload)
	// The pseudo-header: addresses, protocol and UDP length.
	sum := checksum(0, b[12:20])
	sum = checksum(sum, []byte{0, 17, u[4], u[5]})
	c := ^checksum(sum, u)
	if c == 0 {
		c = 0xffff // zero means "no checksum"
	}
	binary.BigEndian.PutUint16(u[6:8], c)
	return b
}

// checksum adds b to the ones' complement sum sum (RFC 1071).
func checksum(sum uint16, b []byte) uint16 {
	s := uint32(sum)
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}
