// Package usbip serves USB devices in the Linux USB/IP wire format
// (tools/usb/usbip, Documentation/usb/usbip_protocol.rst): the device
// list, the import of one device, then its URBs (CMD_SUBMIT and
// CMD_UNLINK) until the client lets it go. The box offers a key this way
// on loopback, where the kernel's vhci-hcd, or usbip-win2 on Windows,
// attaches it. Every field from the network is checked before use.
package usbip

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Version is the protocol version this package speaks (1.1.1).
const Version = 0x0111

// Operation codes, before a device is imported.
const (
	opReqDevlist = 0x8005
	opRepDevlist = 0x0005
	opReqImport  = 0x8003
	opRepImport  = 0x0003
)

// URB commands, once a device is imported.
const (
	cmdSubmit = 1
	cmdUnlink = 2
	retSubmit = 3
	retUnlink = 4
)

// Statuses of an operation's reply.
const (
	stOK    = 0
	stNA    = 1 // the device is not available
	stError = 2
)

// Errno values a URB ends with, negated as Linux sends them.
const (
	errnoEPIPE      = 32  // stalled
	errnoENOENT     = 2   // ended: the device went
	errnoECONNRESET = 104 // unlinked
)

const (
	opHeaderSize  = 8
	busIDSize     = 32
	pathSize      = 256
	deviceSize    = pathSize + busIDSize + 12 + 6 + 6 // usbip_usb_device
	urbHeaderSize = 48
	// MaxTransfer bounds one URB's data: a key's transfers are a few
	// hundred bytes; a client asking for more is refused.
	MaxTransfer = 1 << 20
)

// opHeader is the header of an operation (OP_REQ_*, OP_REP_*).
type opHeader struct {
	Version, Code uint16
	Status        uint32
}

func readOpHeader(r io.Reader) (opHeader, error) {
	var b [opHeaderSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return opHeader{}, err
	}
	return opHeader{Version: binary.BigEndian.Uint16(b[0:]), Code: binary.BigEndian.Uint16(b[2:]), Status: binary.BigEndian.Uint32(b[4:])}, nil
}

func appendOpHeader(b []byte, code uint16, status uint32) []byte {
	b = binary.BigEndian.AppendUint16(b, Version)
	b = binary.BigEndian.AppendUint16(b, code)
	return binary.BigEndian.AppendUint32(b, status)
}

// appendDevice appends the device's usbip_usb_device, and its
// interfaces when withInterfaces (a device list has them, an import's
// reply not).
func appendDevice(b []byte, busID string, busnum, devnum uint32, info usbdev.Info, withInterfaces bool) []byte {
	b = appendFixed(b, "/sys/devices/edgebox/"+busID, pathSize)
	b = appendFixed(b, busID, busIDSize)
	b = binary.BigEndian.AppendUint32(b, busnum)
	b = binary.BigEndian.AppendUint32(b, devnum)
	b = binary.BigEndian.AppendUint32(b, uint32(info.Speed))
	b = binary.BigEndian.AppendUint16(b, info.Vendor)
	b = binary.BigEndian.AppendUint16(b, info.Product)
	b = binary.BigEndian.AppendUint16(b, info.BCDDevice)
	b = append(b, info.Class, info.SubClass, info.Protocol, info.Configuration, 1, uint8(len(info.Interfaces)))
	if withInterfaces {
		for _, i := range info.Interfaces {
			b = append(b, i.Class, i.SubClass, i.Protocol, 0)
		}
	}
	return b
}

// appendFixed appends s in n bytes, NUL-padded (and NUL-ended: cut to
// n-1).
func appendFixed(b []byte, s string, n int) []byte {
	if len(s) > n-1 {
		s = s[:n-1]
	}
	b = append(b, s...)
	return append(b, make([]byte, n-len(s))...)
}

// cString reads a NUL-padded field.
func cString(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\x00")
	return s
}

// urb is a CMD_SUBMIT or CMD_UNLINK as read.
type urb struct {
	command, seqnum, devid, direction, ep uint32
	// CMD_SUBMIT
	flags   uint32
	length  int32 // transfer_buffer_length
	packets int32 // number_of_packets: isochronous, which keys are not
	setup   [8]byte
	// CMD_UNLINK
	unlink uint32
}

const (
	dirOut = 0
	dirIn  = 1
)

// parseURB reads a URB's 48-byte header, checking what it can alone.
func parseURB(b [urbHeaderSize]byte) (urb, error) {
	u := urb{command: be32(b[0:]), seqnum: be32(b[4:]), devid: be32(b[8:]), direction: be32(b[12:]), ep: be32(b[16:])}
	switch u.command {
	case cmdSubmit:
		u.flags, u.length, u.packets = be32(b[20:]), int32(be32(b[24:])), int32(be32(b[32:]))
		copy(u.setup[:], b[40:48])
		switch {
		case u.direction != dirOut && u.direction != dirIn:
			return u, fmt.Errorf("usbip: direction %d", u.direction)
		case u.ep > 15:
			return u, fmt.Errorf("usbip: endpoint %d", u.ep)
		case u.length < 0 || u.length > MaxTransfer:
			return u, fmt.Errorf("usbip: a transfer of %d bytes; at most %d", u.length, MaxTransfer)
		case u.packets > 0: // (-1 and 0 both say none)
			return u, fmt.Errorf("usbip: an isochronous transfer (%d packets); a key has none", u.packets)
		}
	case cmdUnlink:
		u.unlink = be32(b[20:])
	default:
		return u, fmt.Errorf("usbip: command %#x is not a client's", u.command)
	}
	return u, nil
}

func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

// appendRetSubmit appends a RET_SUBMIT and its IN data.
// number_of_packets is the request's, as the client sent it (0, or
// 0xffffffff, for a transfer that is not isochronous).
func appendRetSubmit(b []byte, seqnum uint32, status int32, in []byte, outLength int, packets int32) []byte {
	b = binary.BigEndian.AppendUint32(b, retSubmit)
	b = binary.BigEndian.AppendUint32(b, seqnum)
	b = append(b, make([]byte, 12)...) // devid, direction, ep: 0
	b = binary.BigEndian.AppendUint32(b, uint32(status))
	actual := len(in)
	if in == nil {
		actual = outLength
	}
	b = binary.BigEndian.AppendUint32(b, uint32(actual))
	b = append(b, make([]byte, 4)...) // start_frame
	b = binary.BigEndian.AppendUint32(b, uint32(packets))
	b = append(b, make([]byte, 12)...) // error_count, padding
	return append(b, in...)
}

// appendRetUnlink appends a RET_UNLINK.
func appendRetUnlink(b []byte, seqnum uint32, status int32) []byte {
	b = binary.BigEndian.AppendUint32(b, retUnlink)
	b = binary.BigEndian.AppendUint32(b, seqnum)
	b = append(b, make([]byte, 12)...)
	b = binary.BigEndian.AppendUint32(b, uint32(status))
	return append(b, make([]byte, 24)...)
}
