// Package usbip serves USB devices in the Linux USB/IP wire format
// (tools/usb/usbip, Documentation/usb/usbip_protocol.rst): the device
// list, the import of one device, then its URBs (CMD_SUBMIT and
// CMD_UNLINK) until the client lets it go. The box offers a key this way
// on loopback, where the kernel's vhci-hcd, or usbip-win2 on Windows,
// attaches it. Every field from the network is checked before use.
//
// Between two edgebox boxes the same server also offers a resumable
// import (edgebox's own operations, outside Linux's codes: see
// opReqImportResumable), which a Remote uses: a session that outlives a
// lost connection for a window, resumed over a new one with every URB
// answered once and none run twice.
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

// Operation codes of edgebox's resumable sessions (resume.go), private to
// edgebox's client and server; Linux uses none of them (its ops are
// 0x8002 to 0x8005, and their replies 0x0002 to 0x0005). After the 8-byte
// header, all big-endian:
//
//	OP_REQ_IMPORT_RESUMABLE 0x80e1: busid[32] session_id[16]
//	OP_REP_IMPORT_RESUMABLE 0x00e1: status (stNA: not offered, or in
//	    use; stError: the session ID is taken); when 0, usbip_usb_device
//	    (312 bytes, as OP_REP_IMPORT has it), then URBs as after
//	    OP_REP_IMPORT.
//	OP_REQ_RESUME 0x80e2: session_id[16] count:u32 seqnum:u32 × count
//	    (count ≤ 64, no seqnum twice): the URBs the client still waits for.
//	OP_REP_RESUME 0x00e2: status (stNoSession: unknown or ended); when 0,
//	    usbip_usb_device, count:u32 (the request's), then (seqnum:u32
//	    state:u32) × count in the request's order, state one of
//	    resumeAnswered, resumeResubmit, resumeLost. Then URBs: first the
//	    replies the server kept, then the others as they end. A resume
//	    takes the session from the connection it has, if any (closed).
//
// In a resumable session the client's seqnums (CMD_SUBMIT and CMD_UNLINK
// alike) go out in increasing order, and a server reads none twice; the
// client has at most maxInFlight URBs unanswered, and the server keeps its
// last maxInFlight RET_SUBMITs until a resume says they arrived. A client
// ends the session (rather than leave it held) with cmdRelease.
const (
	opReqImportResumable = 0x80e1
	opRepImportResumable = 0x00e1
	opReqResume          = 0x80e2
	opRepResume          = 0x00e2
)

// States of a URB in OP_REP_RESUME.
const (
	// resumeAnswered: running, or ended with its reply kept; the reply
	// comes on the new connection.
	resumeAnswered = 0
	// resumeResubmit: never read by the server; the client submits it
	// again (with the same seqnum).
	resumeResubmit = 1
	// resumeLost: the server ran it and no longer has its reply, which a
	// client keeping to maxInFlight never sees. It is not run again.
	resumeLost = 2
)

// sessionIDSize is the length of a resumable session's ID: random,
// chosen by the client, and what a resume names.
const sessionIDSize = 16

type sessionID [sessionIDSize]byte

// URB commands, once a device is imported.
const (
	cmdSubmit = 1
	cmdUnlink = 2
	retSubmit = 3
	retUnlink = 4
	// cmdRelease (edgebox's, in a resumable session only: a 48-byte
	// header, all zero but the command) ends the session: the device is
	// free at once, rather than held for a resume.
	cmdRelease = 0xe1
)

// Statuses of an operation's reply.
const (
	stOK    = 0
	stNA    = 1 // the device is not available
	stError = 2
	// stNoSession (edgebox's, OP_REP_RESUME): no such session, or it has
	// ended; the device is gone for that client.
	stNoSession = 0xe1
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
	case cmdRelease:
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

// parseDevice reads an import's usbip_usb_device: the bus ID, the device
// ID URBs name (busnum<<16 | devnum), and what the device is.
func parseDevice(d []byte) (busID string, devid uint32, info usbdev.Info) {
	o := pathSize + busIDSize
	return cString(d[pathSize:o]), be32(d[o:])<<16 | be32(d[o+4:])&0xffff,
		usbdev.Info{Speed: usbdev.Speed(be32(d[o+8:])), Vendor: binary.BigEndian.Uint16(d[o+12:]), Product: binary.BigEndian.Uint16(d[o+14:]),
			BCDDevice: binary.BigEndian.Uint16(d[o+16:]), Class: d[o+18], SubClass: d[o+19], Protocol: d[o+20], Configuration: d[o+21]}
}

// appendResumeRequest appends an OP_REQ_RESUME.
func appendResumeRequest(b []byte, id sessionID, waiting []uint32) []byte {
	b = appendOpHeader(b, opReqResume, 0)
	b = append(b, id[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(waiting)))
	for _, seq := range waiting {
		b = binary.BigEndian.AppendUint32(b, seq)
	}
	return b
}

// readResumeRequest reads an OP_REQ_RESUME after its header: at most
// maxInFlight seqnums, none twice.
func readResumeRequest(r io.Reader) (sessionID, []uint32, error) {
	var b [sessionIDSize + 4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return sessionID{}, nil, err
	}
	id := sessionID(b[:sessionIDSize])
	waiting, err := readSeqnums(r, be32(b[sessionIDSize:]), 1)
	if err != nil {
		return id, nil, err
	}
	seen := make(map[uint32]bool, len(waiting))
	for _, seq := range waiting {
		if seen[seq] {
			return id, nil, fmt.Errorf("usbip: a resume names URB %d twice", seq)
		}
		seen[seq] = true
	}
	return id, waiting, nil
}

// readSeqnums reads n records of words u32 each, the first of each a
// seqnum, and returns them (all words, flat); n is at most maxInFlight.
func readSeqnums(r io.Reader, n uint32, words int) ([]uint32, error) {
	if n > maxInFlight {
		return nil, fmt.Errorf("usbip: a resume of %d URBs; at most %d", n, maxInFlight)
	}
	b := make([]byte, int(n)*words*4)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	out := make([]uint32, 0, int(n)*words)
	for i := 0; i < len(b); i += 4 {
		out = append(out, be32(b[i:]))
	}
	return out, nil
}

// appendResumeStates appends OP_REP_RESUME's states, after its device:
// states[i] is waiting[i]'s.
func appendResumeStates(b []byte, waiting, states []uint32) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(waiting)))
	for i, seq := range waiting {
		b = binary.BigEndian.AppendUint32(b, seq)
		b = binary.BigEndian.AppendUint32(b, states[i])
	}
	return b
}

// readResumeStates reads OP_REP_RESUME's states, which must answer
// waiting, in its order.
func readResumeStates(r io.Reader, waiting []uint32) ([]uint32, error) {
	var nb [4]byte
	if _, err := io.ReadFull(r, nb[:]); err != nil {
		return nil, err
	}
	if n := be32(nb[:]); n != uint32(len(waiting)) {
		return nil, fmt.Errorf("usbip: a resume answered for %d URBs, not the %d asked", n, len(waiting))
	}
	pairs, err := readSeqnums(r, uint32(len(waiting)), 2)
	if err != nil {
		return nil, err
	}
	states := make([]uint32, len(waiting))
	for i, seq := range waiting {
		if pairs[2*i] != seq {
			return nil, fmt.Errorf("usbip: a resume answered for URB %d, not %d", pairs[2*i], seq)
		}
		if states[i] = pairs[2*i+1]; states[i] > resumeLost {
			return nil, fmt.Errorf("usbip: URB %d resumes in state %d", seq, states[i])
		}
	}
	return states, nil
}

// after reports whether seqnum a comes after b, seqnums wrapping around
// (RFC 1982's serial number arithmetic).
func after(a, b uint32) bool { return int32(a-b) > 0 }
