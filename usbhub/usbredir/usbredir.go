// Package usbredir is the usb-host side of the USB redirection protocol
// (usbredir 0.7, spice's): it offers one usbdev.Device to a usb-guest,
// QEMU's usb-redir device, over a byte stream (a chardev socket). The
// guest then sees the key on its own USB bus with no USB/IP driver in
// any kernel. Every packet from the guest is checked before use.
package usbredir

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Packet types (usbredirproto.h).
const (
	typeHello                   = 0
	typeDeviceConnect           = 1
	typeDeviceDisconnect        = 2
	typeReset                   = 3
	typeInterfaceInfo           = 4
	typeEpInfo                  = 5
	typeSetConfiguration        = 6
	typeGetConfiguration        = 7
	typeConfigurationStatus     = 8
	typeSetAltSetting           = 9
	typeGetAltSetting           = 10
	typeAltSettingStatus        = 11
	typeStartIsoStream          = 12
	typeStopIsoStream           = 13
	typeIsoStreamStatus         = 14
	typeStartInterruptReceiving = 15
	typeStopInterruptReceiving  = 16
	typeInterruptReceivingStat  = 17
	typeAllocBulkStreams        = 18
	typeFreeBulkStreams         = 19
	typeBulkStreamsStatus       = 20
	typeCancelDataPacket        = 21
	typeFilterReject            = 22
	typeFilterFilter            = 23
	typeDeviceDisconnectAck     = 24
	typeStartBulkReceiving      = 25
	typeStopBulkReceiving       = 26
	typeBulkReceivingStatus     = 27
	typeControlPacket           = 100
	typeBulkPacket              = 101
	typeIsoPacket               = 102
	typeInterruptPacket         = 103
)

// Capabilities, as bits of the hello's first word.
const (
	capConnectDeviceVersion = 1
	capDeviceDisconnectAck  = 3
	capEpInfoMaxPacketSize  = 4
	cap64BitIDs             = 5
	cap32BitBulkLength      = 6
)

// ours are the capabilities this side announces: what QEMU's xHCI needs
// (max packet sizes, 64-bit ids, 32-bit bulk lengths) and the device's
// version.
const ours = 1<<capConnectDeviceVersion | 1<<capEpInfoMaxPacketSize | 1<<cap64BitIDs | 1<<cap32BitBulkLength

// Statuses.
const (
	statusSuccess   = 0
	statusCancelled = 1
	statusInval     = 2
	statusIOError   = 3
	statusStall     = 4
)

// MaxPacket bounds a packet's length field: a key's transfers are small.
const MaxPacket = 1 << 20

// Host offers one device to one guest.
type Host struct {
	dev     usbdev.Device
	rw      io.ReadWriter
	log     *slog.Logger
	version string

	peer   uint32 // the guest's capabilities
	ids64  bool
	config usbdev.Config

	wmu sync.Mutex // writes

	mu        sync.Mutex
	pending   map[uint64]context.CancelFunc // data packets in flight, by id
	receiving map[uint8]context.CancelFunc  // interrupt IN endpoints being polled
	wg        sync.WaitGroup
}

// Serve offers dev to the guest at the other end of rw until it goes, it
// sends what the protocol does not allow, or ctx ends (the caller then
// closes rw to end the read). It says hello, tells the device's
// endpoints, interfaces and identity, then carries the guest's
// transfers.
func Serve(ctx context.Context, rw io.ReadWriter, dev usbdev.Device, log *slog.Logger) error {
	h := &Host{dev: dev, rw: rw, log: log.With("component", "usbredir"), version: "edgebox usbredir",
		pending: map[uint64]context.CancelFunc{}, receiving: map[uint8]context.CancelFunc{}}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		h.wg.Wait()
	}()
	return h.serve(ctx)
}

func (h *Host) serve(ctx context.Context) error {
	hello := make([]byte, 64, 68)
	copy(hello, h.version)
	if err := h.send(typeHello, 0, binary.LittleEndian.AppendUint32(hello, ours), nil); err != nil {
		return err
	}
	typ, _, body, err := h.read()
	if err != nil {
		return err
	}
	if typ != typeHello || len(body) < 64 {
		return fmt.Errorf("usbredir: the guest's first packet is type %d, not a hello", typ)
	}
	if len(body) >= 68 {
		h.peer = binary.LittleEndian.Uint32(body[64:])
	}
	h.ids64 = h.both(cap64BitIDs)
	if h.config, err = usbdev.ReadConfig(ctx, h.dev); err != nil {
		return err
	}
	if err := h.sendDeviceInfo(); err != nil {
		return err
	}
	info := h.dev.Info()
	connect := []byte{redirSpeed(info.Speed), info.Class, info.SubClass, info.Protocol}
	connect = binary.LittleEndian.AppendUint16(connect, info.Vendor)
	connect = binary.LittleEndian.AppendUint16(connect, info.Product)
	if h.both(capConnectDeviceVersion) {
		connect = binary.LittleEndian.AppendUint16(connect, info.BCDDevice)
	}
	if err := h.send(typeDeviceConnect, 0, connect, nil); err != nil {
		return err
	}
	for {
		typ, id, body, err := h.read()
		if err != nil {
			return err
		}
		if err := h.handle(ctx, typ, id, body); err != nil {
			return err
		}
	}
}

func (h *Host) both(c uint) bool { return h.peer&(1<<c) != 0 && ours&(1<<c) != 0 }

// redirSpeed is a usbdev speed as usbredir numbers it.
func redirSpeed(s usbdev.Speed) uint8 {
	switch s {
	case usbdev.SpeedLow:
		return 0
	case usbdev.SpeedFull:
		return 1
	case usbdev.SpeedHigh:
		return 2
	}
	return 255
}

// sendDeviceInfo tells the guest the endpoints, then the interfaces, of
// the configuration: after the connection, and after each change of
// configuration or alternate setting.
func (h *Host) sendDeviceInfo() error {
	var types, intervals, ifaces [32]uint8
	var mps [32]uint16
	for i := range types {
		types[i] = 255 // invalid: no such endpoint
	}
	types[0], types[16], mps[0], mps[16] = 0, 0, 64, 64 // endpoint 0, both ways: control
	for _, e := range h.config.Endpoints {
		i := int(e.Address & 0x0f)
		if e.Address&0x80 != 0 {
			i += 16
		}
		types[i], intervals[i], ifaces[i], mps[i] = e.Type, e.Interval, e.Interface, e.MaxPacketSize
	}
	ep := append(append(append([]byte{}, types[:]...), intervals[:]...), ifaces[:]...)
	if h.both(capEpInfoMaxPacketSize) {
		for _, m := range mps {
			ep = binary.LittleEndian.AppendUint16(ep, m)
		}
	}
	if err := h.send(typeEpInfo, 0, ep, nil); err != nil {
		return err
	}
	var num, class, sub, proto [32]uint8
	for i, f := range h.config.Interfaces {
		num[i], class[i], sub[i], proto[i] = f.Number, f.Class, f.SubClass, f.Protocol
	}
	ii := binary.LittleEndian.AppendUint32(nil, uint32(len(h.config.Interfaces)))
	ii = append(append(append(append(ii, num[:]...), class[:]...), sub[:]...), proto[:]...)
	return h.send(typeInterfaceInfo, 0, ii, nil)
}

// headerSize is the packet header's size: 16 with 64-bit ids, else 12.
func (h *Host) headerSize() int {
	if h.ids64 {
		return 16
	}
	return 12
}

// read reads one packet: its type, id and body (its type's header and
// data).
func (h *Host) read() (typ uint32, id uint64, body []byte, err error) {
	hb := make([]byte, h.headerSize())
	if _, err := io.ReadFull(h.rw, hb); err != nil {
		return 0, 0, nil, err
	}
	typ, n := binary.LittleEndian.Uint32(hb), binary.LittleEndian.Uint32(hb[4:])
	if h.ids64 {
		id = binary.LittleEndian.Uint64(hb[8:])
	} else {
		id = uint64(binary.LittleEndian.Uint32(hb[8:]))
	}
	if n > MaxPacket {
		return 0, 0, nil, fmt.Errorf("usbredir: a packet of %d bytes; at most %d", n, MaxPacket)
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(h.rw, body); err != nil {
		return 0, 0, nil, err
	}
	return typ, id, body, nil
}

// send writes one packet: its type's header, then its data.
func (h *Host) send(typ uint32, id uint64, header, data []byte) error {
	b := binary.LittleEndian.AppendUint32(nil, typ)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(header)+len(data)))
	if h.ids64 {
		b = binary.LittleEndian.AppendUint64(b, id)
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	b = append(append(b, header...), data...)
	h.wmu.Lock()
	defer h.wmu.Unlock()
	_, err := h.rw.Write(b)
	return err
}

// errBadPacket says a packet is not what its type needs.
var errBadPacket = errors.New("usbredir: a packet too short for its type")

// handle runs one packet from the guest. Control packets (configuration,
// alternate settings, receiving) are answered in order; data packets
// (transfers) run on their own and are answered when they end.
func (h *Host) handle(ctx context.Context, typ uint32, id uint64, body []byte) error {
	need := func(n int) error {
		if len(body) < n {
			return fmt.Errorf("%w: type %d, %d bytes", errBadPacket, typ, len(body))
		}
		return nil
	}
	switch typ {
	case typeReset, typeFilterReject, typeFilterFilter, typeDeviceDisconnectAck:
		return nil
	case typeSetConfiguration:
		if err := need(1); err != nil {
			return err
		}
		_, err := h.dev.Control(ctx, usbdev.Setup{Request: usbdev.RequestSetConfiguration, Value: uint16(body[0])}, nil)
		if err == nil {
			if cfg, cerr := usbdev.ReadConfig(ctx, h.dev); cerr == nil {
				h.config = cfg
			}
			if err := h.sendDeviceInfo(); err != nil {
				return err
			}
		}
		return h.send(typeConfigurationStatus, id, []byte{status(err), body[0]}, nil)
	case typeGetConfiguration:
		out, err := h.dev.Control(ctx, usbdev.Setup{RequestType: 0x80, Request: usbdev.RequestGetConfiguration, Length: 1}, nil)
		value := uint8(0)
		if len(out) == 1 {
			value = out[0]
		}
		return h.send(typeConfigurationStatus, id, []byte{status(err), value}, nil)
	case typeSetAltSetting:
		if err := need(2); err != nil {
			return err
		}
		_, err := h.dev.Control(ctx, usbdev.Setup{RequestType: 0x01, Request: usbdev.RequestSetInterface, Value: uint16(body[1]), Index: uint16(body[0])}, nil)
		if err == nil {
			if err := h.sendDeviceInfo(); err != nil {
				return err
			}
		}
		return h.send(typeAltSettingStatus, id, []byte{status(err), body[0], body[1]}, nil)
	case typeGetAltSetting:
		if err := need(1); err != nil {
			return err
		}
		return h.send(typeAltSettingStatus, id, []byte{statusSuccess, body[0], 0}, nil)
	case typeStartInterruptReceiving, typeStopInterruptReceiving:
		if err := need(1); err != nil {
			return err
		}
		st := h.receive(ctx, body[0], typ == typeStartInterruptReceiving)
		return h.send(typeInterruptReceivingStat, id, []byte{st, body[0]}, nil)
	case typeStartIsoStream, typeStopIsoStream:
		if err := need(1); err != nil {
			return err
		}
		return h.send(typeIsoStreamStatus, id, []byte{statusInval, body[0]}, nil) // a key has no isochronous endpoint
	case typeAllocBulkStreams, typeFreeBulkStreams:
		if err := need(4); err != nil {
			return err
		}
		return h.send(typeBulkStreamsStatus, id, append(append(append([]byte{}, body[:4]...), 0, 0, 0, 0), statusInval), nil)
	case typeStartBulkReceiving, typeStopBulkReceiving:
		if err := need(5); err != nil {
			return err
		}
		return h.send(typeBulkReceivingStatus, id, append(append([]byte{}, body[:4]...), body[4], statusInval), nil)
	case typeCancelDataPacket:
		h.mu.Lock()
		cancel, ok := h.pending[id]
		h.mu.Unlock()
		if ok {
			cancel() // its own answer says "cancelled"
		}
		return nil
	case typeControlPacket:
		return h.control(ctx, id, body)
	case typeBulkPacket, typeInterruptPacket:
		return h.transfer(ctx, typ, id, body)
	}
	return fmt.Errorf("usbredir: packet type %d is not a guest's", typ)
}

// status is a transfer's outcome as usbredir says it.
func status(err error) uint8 {
	switch {
	case err == nil:
		return statusSuccess
	case errors.Is(err, usbdev.ErrStall):
		return statusStall
	case errors.Is(err, context.Canceled):
		return statusCancelled
	}
	return statusIOError
}

// start runs a data packet on its own, cancellable by its id, and
// answers it when done.
func (h *Host) start(ctx context.Context, id uint64, run func(context.Context)) error {
	h.mu.Lock()
	if _, dup := h.pending[id]; dup {
		h.mu.Unlock()
		return fmt.Errorf("usbredir: data packet %d sent twice", id)
	}
	if len(h.pending) >= maxPending {
		h.mu.Unlock()
		return fmt.Errorf("usbredir: more than %d data packets in flight", maxPending)
	}
	pctx, cancel := context.WithCancel(ctx)
	h.pending[id] = cancel
	h.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer func() {
			h.mu.Lock()
			delete(h.pending, id)
			h.mu.Unlock()
			cancel()
		}()
		run(pctx)
	}()
	return nil
}

// maxPending bounds the data packets in flight at once.
const maxPending = 64

// control runs a control packet: endpoint, request, requesttype, status,
// value, index, length, then OUT data.
func (h *Host) control(ctx context.Context, id uint64, body []byte) error {
	if len(body) < 10 {
		return fmt.Errorf("%w: a control packet of %d bytes", errBadPacket, len(body))
	}
	hdr := append([]byte{}, body[:10]...)
	setup := usbdev.Setup{Request: hdr[1], RequestType: hdr[2], Value: binary.LittleEndian.Uint16(hdr[4:]),
		Index: binary.LittleEndian.Uint16(hdr[6:]), Length: binary.LittleEndian.Uint16(hdr[8:])}
	out := body[10:]
	return h.start(ctx, id, func(ctx context.Context) {
		var in []byte
		var err error
		if setup.In() {
			in, err = h.dev.Control(ctx, setup, nil)
			if len(in) > int(setup.Length) {
				in = in[:setup.Length]
			}
		} else {
			_, err = h.dev.Control(ctx, setup, out)
		}
		hdr[3] = status(err)
		n := len(in)
		if !setup.In() && err == nil {
			n = len(out)
		}
		binary.LittleEndian.PutUint16(hdr[8:], uint16(n))
		h.send(typeControlPacket, id, hdr, in)
	})
}

// transfer runs a bulk packet (endpoint, status, length, stream, and the
// length's high half with 32-bit lengths) or an OUT interrupt packet
// (endpoint, status, length).
func (h *Host) transfer(ctx context.Context, typ uint32, id uint64, body []byte) error {
	size := 4
	if typ == typeBulkPacket {
		size = 8
		if h.both(cap32BitBulkLength) {
			size = 10
		}
	}
	if len(body) < size {
		return fmt.Errorf("%w: type %d, %d bytes", errBadPacket, typ, len(body))
	}
	hdr := append([]byte{}, body[:size]...)
	ep := hdr[0]
	length := int(binary.LittleEndian.Uint16(hdr[2:]))
	if size == 10 {
		length |= int(binary.LittleEndian.Uint16(hdr[8:])) << 16
	}
	if length > MaxPacket {
		return fmt.Errorf("usbredir: a transfer of %d bytes; at most %d", length, MaxPacket)
	}
	if typ == typeInterruptPacket && ep&0x80 != 0 {
		return fmt.Errorf("usbredir: an interrupt IN packet from the guest; it asks to receive instead")
	}
	out := body[size:]
	return h.start(ctx, id, func(ctx context.Context) {
		var in []byte
		var err error
		if ep&0x80 != 0 {
			in, err = h.dev.Transfer(ctx, ep, nil, length)
			if len(in) > length {
				in = in[:length]
			}
		} else {
			_, err = h.dev.Transfer(ctx, ep, out, 0)
		}
		hdr[1] = status(err)
		n := len(in)
		if ep&0x80 == 0 && err == nil {
			n = len(out)
		}
		binary.LittleEndian.PutUint16(hdr[2:], uint16(n))
		if size == 10 {
			binary.LittleEndian.PutUint16(hdr[8:], uint16(n>>16))
		}
		h.send(typ, id, hdr, in)
	})
}

// receive starts or stops polling an interrupt IN endpoint: each
// transfer that completes goes to the guest as an interrupt packet, ids
// counting from 0. It returns the status to answer.
func (h *Host) receive(ctx context.Context, ep uint8, start bool) uint8 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if stop, ok := h.receiving[ep]; ok {
		stop()
		delete(h.receiving, ep)
	}
	if !start {
		return statusSuccess
	}
	var mps uint16
	for _, e := range h.config.Endpoints {
		if e.Address == ep && e.Type == 3 {
			mps = e.MaxPacketSize
		}
	}
	if ep&0x80 == 0 || mps == 0 {
		return statusInval
	}
	rctx, cancel := context.WithCancel(ctx)
	h.receiving[ep] = cancel
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for n := uint64(0); ; n++ {
			in, err := h.dev.Transfer(rctx, ep, nil, int(mps))
			if rctx.Err() != nil {
				return
			}
			hdr := []byte{ep, status(err), 0, 0}
			binary.LittleEndian.PutUint16(hdr[2:], uint16(len(in)))
			if h.send(typeInterruptPacket, n, hdr, in) != nil || err != nil {
				return
			}
		}
	}()
	return statusSuccess
}
