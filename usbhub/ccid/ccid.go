// Package ccid is a simulated USB smart-card reader with a card in it
// (CCID, USB class 0x0B), which is what most bank keys present. It
// answers the descriptors and control requests a host's driver sends,
// the reader's commands (power, slot status, parameters, a block to the
// card) and, on the card, a small application: SELECT, GET DATA (the
// serial, the public key) and a signature over the data sent, with a
// fixed test key. Tests and demos export it as a physical key would be.
package ccid

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
	"unicode/utf16"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// AID is the card application's identifier, which SELECT names.
var AID = []byte{0xF0, 'E', 'D', 'G', 'E', 'B', 'O', 'X'}

// Endpoints of the reader.
const (
	EndpointOut       = 0x01 // bulk: commands to the reader
	EndpointIn        = 0x82 // bulk: the reader's answers
	EndpointInterrupt = 0x83 // slot changes
)

// MaxMessage bounds a reader command: a 10-byte header and a short APDU.
const MaxMessage = 10 + 5 + 255 + 1

// Instructions of the card's application (ISO 7816-4).
const (
	insSelect  = 0xA4
	insGetData = 0xCA
	insPSO     = 0x2A
)

// GET DATA objects the card has.
const (
	DataSerial    = 0x005A
	DataPublicKey = 0x7F49
)

// Key is one simulated key. It is safe for concurrent use.
type Key struct {
	info usbdev.Info
	priv *ecdsa.PrivateKey

	mu         sync.Mutex
	configured uint8
	powered    bool
	selected   bool
	answer     []byte        // what bulk IN reads next
	ready      chan struct{} // closed when answer is set, and replaced once it is read
}

// New returns a key with the given USB vendor and product IDs and serial,
// signing with TestKey.
func New(vendor, product uint16, serial string) *Key {
	return &Key{
		info: usbdev.Info{Vendor: vendor, Product: product, BCDDevice: 0x0100, Configuration: 1, Speed: usbdev.SpeedFull,
			Interfaces: []usbdev.Interface{{Class: 0x0B}}, Serial: serial},
		priv:  TestKey(),
		ready: make(chan struct{}),
	}
}

// TestKey is the fixed P-256 key every simulated card signs with. It is
// public: nothing real may trust it.
func TestKey() *ecdsa.PrivateKey {
	d := sha256.Sum256([]byte("edgebox simulated UKEY test key"))
	k, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), d[:])
	if err != nil {
		panic(err) // a fixed value that parses
	}
	return k
}

// Info says what the key is.
func (k *Key) Info() usbdev.Info { return k.info }

// descriptors of the reader: device, configuration (with the CCID class
// descriptor and three endpoints).
func (k *Key) deviceDescriptor() []byte {
	b := []byte{18, usbdev.DescriptorDevice, 0x00, 0x02, 0, 0, 0, 64}
	b = binary.LittleEndian.AppendUint16(b, k.info.Vendor)
	b = binary.LittleEndian.AppendUint16(b, k.info.Product)
	b = binary.LittleEndian.AppendUint16(b, k.info.BCDDevice)
	return append(b, 1, 2, 3, 1) // manufacturer, product, serial strings; one configuration
}

func configDescriptor() []byte {
	iface := []byte{9, 4, 0, 0, 3, 0x0B, 0, 0, 0}
	class := []byte{0x36, 0x21, 0x10, 0x01, 0, 0x07}        // CCID 1.10, one slot, 5 V, 3 V, 1.8 V
	class = binary.LittleEndian.AppendUint32(class, 0x02)   // T=1
	class = binary.LittleEndian.AppendUint32(class, 3580)   // default clock, kHz
	class = binary.LittleEndian.AppendUint32(class, 3580)   // maximum clock
	class = append(class, 0)                                // clock frequencies: default only
	class = binary.LittleEndian.AppendUint32(class, 9600)   // data rate, bps
	class = binary.LittleEndian.AppendUint32(class, 115200) // maximum data rate
	class = append(class, 0)                                // data rates: default only
	class = binary.LittleEndian.AppendUint32(class, 254)    // IFSD
	class = binary.LittleEndian.AppendUint32(class, 0)      // synchronous protocols
	class = binary.LittleEndian.AppendUint32(class, 0)      // mechanical
	// Automatic parameters, clock, baud rate and voltage; short APDU
	// exchange: the reader takes whole APDUs.
	class = binary.LittleEndian.AppendUint32(class, 0x000200BA)
	class = binary.LittleEndian.AppendUint32(class, MaxMessage)
	class = append(class, 0xFF, 0xFF, 0, 0, 0, 1) // GetResponse, Envelope classes; no LCD, no PIN pad; one busy slot
	eps := []byte{
		7, 5, EndpointOut, 0x02, 64, 0, 0,
		7, 5, EndpointIn, 0x02, 64, 0, 0,
		7, 5, EndpointInterrupt, 0x03, 8, 0, 0x10,
	}
	total := 9 + len(iface) + len(class) + len(eps)
	b := []byte{9, usbdev.DescriptorConfiguration, byte(total), byte(total >> 8), 1, 1, 0, 0x80, 50}
	b = append(b, iface...)
	b = append(b, class...)
	return append(b, eps...)
}

// stringDescriptor is string i (0: the languages), or nil.
func (k *Key) stringDescriptor(i uint8) []byte {
	var s string
	switch i {
	case 0:
		return []byte{4, usbdev.DescriptorString, 0x09, 0x04} // en-US
	case 1:
		s = "edgebox"
	case 2:
		s = "Simulated UKEY (CCID)"
	case 3:
		s = k.info.Serial
	default:
		return nil
	}
	u := utf16.Encode([]rune(s))
	b := []byte{byte(2 + 2*len(u)), usbdev.DescriptorString}
	for _, c := range u {
		b = binary.LittleEndian.AppendUint16(b, c)
	}
	return b
}

// Control answers the standard requests a host's driver sends, and the
// CCID class's ABORT.
func (k *Key) Control(_ context.Context, s usbdev.Setup, _ []byte) ([]byte, error) {
	var out []byte
	switch {
	case s.RequestType == 0x80 && s.Request == usbdev.RequestGetDescriptor:
		switch s.Value >> 8 {
		case usbdev.DescriptorDevice:
			out = k.deviceDescriptor()
		case usbdev.DescriptorConfiguration:
			out = configDescriptor()
		case usbdev.DescriptorString:
			out = k.stringDescriptor(uint8(s.Value))
		}
		if out == nil {
			return nil, usbdev.ErrStall
		}
	case s.RequestType == 0x00 && s.Request == usbdev.RequestSetConfiguration:
		if s.Value > 1 {
			return nil, usbdev.ErrStall
		}
		k.mu.Lock()
		k.configured = uint8(s.Value)
		k.mu.Unlock()
	case s.RequestType == 0x80 && s.Request == usbdev.RequestGetConfiguration:
		k.mu.Lock()
		out = []byte{k.configured}
		k.mu.Unlock()
	case s.RequestType&0x80 != 0 && s.Request == usbdev.RequestGetStatus:
		out = []byte{0, 0}
	case s.RequestType == 0x01 && s.Request == usbdev.RequestSetInterface && s.Value == 0:
	case s.RequestType&0x7F <= 0x02 && s.Request == usbdev.RequestClearFeature:
	case s.RequestType == 0x21 && s.Request == 0x01: // CCID ABORT
	default:
		return nil, usbdev.ErrStall
	}
	if len(out) > int(s.Length) {
		out = out[:s.Length]
	}
	return out, nil
}

// Transfer takes a reader command on the bulk OUT endpoint, gives its
// answer on bulk IN (waiting for one), and holds an interrupt IN until
// ctx ends: the card is never pulled.
func (k *Key) Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	switch ep {
	case EndpointOut:
		answer := k.command(data)
		k.mu.Lock()
		k.answer = answer // an answer nobody read is dropped, as a reader does
		select {
		case <-k.ready: // a command before the last answer was read
		default:
			close(k.ready)
		}
		k.mu.Unlock()
		return nil, nil
	case EndpointIn:
		for {
			k.mu.Lock()
			if k.answer != nil {
				n := min(length, len(k.answer))
				out := k.answer[:n]
				k.answer = k.answer[n:]
				if len(k.answer) == 0 {
					k.answer = nil
					k.ready = make(chan struct{})
				}
				k.mu.Unlock()
				return out, nil
			}
			ready := k.ready
			k.mu.Unlock()
			select {
			case <-ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	case EndpointInterrupt:
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, usbdev.ErrStall
}

// Reader messages (CCID 1.1, section 6).
const (
	pcIccPowerOn     = 0x62
	pcIccPowerOff    = 0x63
	pcGetSlotStatus  = 0x65
	pcGetParameters  = 0x6C
	pcXfrBlock       = 0x6F
	rdrDataBlock     = 0x80
	rdrSlotStatus    = 0x81
	rdrParameters    = 0x82
	statusFailed     = 0x40
	iccActive        = 0x00
	iccInactive      = 0x01
	errCmdNotSupport = 0x00
	errICCMute       = 0xFE
	errBadLength     = 0x01
)

// atr is the card's answer to reset: T=1, historical bytes "edgeboxkey",
// and its check byte.
var atr = func() []byte {
	b := append([]byte{0x3B, 0x8A, 0x80, 0x01}, "edgeboxkey"...)
	var tck byte
	for _, c := range b[1:] {
		tck ^= c
	}
	return append(b, tck)
}()

// command runs one reader command and returns the reader's answer. A
// command it cannot read is answered as failed, never ignored: the host
// waits for an answer to each.
func (k *Key) command(m []byte) []byte {
	if len(m) < 10 {
		return reply(rdrSlotStatus, 0, 0, statusFailed|iccInactive, errBadLength, 0, nil)
	}
	typ, n, slot, seq := m[0], binary.LittleEndian.Uint32(m[1:5]), m[5], m[6]
	body := m[10:]
	if int64(n) != int64(len(body)) || len(m) > MaxMessage {
		return reply(rdrSlotStatus, slot, seq, statusFailed|iccInactive, errBadLength, 0, nil)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	state := byte(iccInactive)
	if k.powered {
		state = iccActive
	}
	switch typ {
	case pcIccPowerOn:
		k.powered, k.selected = true, false
		return reply(rdrDataBlock, slot, seq, iccActive, 0, 0, atr)
	case pcIccPowerOff:
		k.powered, k.selected = false, false
		return reply(rdrSlotStatus, slot, seq, iccInactive, 0, 0, nil)
	case pcGetSlotStatus:
		return reply(rdrSlotStatus, slot, seq, state, 0, 0, nil)
	case pcGetParameters:
		return reply(rdrParameters, slot, seq, state, 0, 1, []byte{0x11, 0x10, 0x00, 0x45, 0x00, 0xFE, 0x00})
	case pcXfrBlock:
		if !k.powered {
			return reply(rdrDataBlock, slot, seq, statusFailed|iccInactive, errICCMute, 0, nil)
		}
		return reply(rdrDataBlock, slot, seq, iccActive, 0, 0, k.apdu(body))
	}
	return reply(rdrSlotStatus, slot, seq, statusFailed|state, errCmdNotSupport, 0, nil)
}

// reply is a reader message to the host.
func reply(typ, slot, seq, status, errCode, specific byte, data []byte) []byte {
	b := []byte{typ}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	b = append(b, slot, seq, status, errCode, specific)
	return append(b, data...)
}

// sw appends a status word to data.
func sw(data []byte, w uint16) []byte { return binary.BigEndian.AppendUint16(data, w) }

// apdu runs one command APDU on the card; hold k.mu.
func (k *Key) apdu(c []byte) []byte {
	if len(c) < 4 {
		return sw(nil, 0x6700) // wrong length
	}
	cla, ins, p1, p2 := c[0], c[1], c[2], c[3]
	data, ok := commandData(c[4:])
	if !ok {
		return sw(nil, 0x6700)
	}
	if cla != 0x00 {
		return sw(nil, 0x6E00) // class not supported
	}
	switch ins {
	case insSelect:
		if p1 != 0x04 || !bytes.Equal(data, AID) {
			k.selected = false
			return sw(nil, 0x6A82) // not found
		}
		k.selected = true
		return sw(nil, 0x9000)
	case insGetData:
		switch uint16(p1)<<8 | uint16(p2) {
		case DataSerial:
			return sw([]byte(k.info.Serial), 0x9000)
		case DataPublicKey:
			pub, err := k.priv.PublicKey.Bytes()
			if err != nil {
				return sw(nil, 0x6F00)
			}
			return sw(pub, 0x9000)
		}
		return sw(nil, 0x6A88) // no such data
	case insPSO:
		switch {
		case p1 != 0x9E || p2 != 0x9A:
			return sw(nil, 0x6A86) // wrong P1 P2
		case !k.selected:
			return sw(nil, 0x6985) // conditions not satisfied
		case len(data) == 0:
			return sw(nil, 0x6700)
		}
		digest := sha256.Sum256(data)
		sig, err := ecdsa.SignASN1(rand.Reader, k.priv, digest[:])
		if err != nil {
			return sw(nil, 0x6F00)
		}
		return sw(sig, 0x9000)
	}
	return sw(nil, 0x6D00) // instruction not supported
}

// commandData reads a short APDU's body (Lc, data, Le), and reports
// whether it is well formed.
func commandData(b []byte) ([]byte, bool) {
	switch {
	case len(b) == 0, len(b) == 1: // no data; or only Le
		return nil, true
	case int(b[0]) == len(b)-1 && b[0] != 0: // Lc, data
		return b[1:], true
	case int(b[0]) == len(b)-2 && b[0] != 0: // Lc, data, Le
		return b[1 : len(b)-1], true
	}
	return nil, false
}

// String names the key.
func (k *Key) String() string {
	return fmt.Sprintf("simulated CCID key %04x:%04x %s", k.info.Vendor, k.info.Product, k.info.Serial)
}
