// Package usbdev is a USB device as the exporters of a key drive it (the
// USB/IP server, and usbredir): what it says it is, and transfers to its
// endpoints. A physical key (through libusb) and a simulated one stand
// behind the same interface.
package usbdev

import (
	"context"
	"encoding/binary"
	"errors"
)

// Device is one USB device an exporter drives. Transfers may run at
// once on different endpoints; each one ends when ctx does, with
// ctx's error.
type Device interface {
	// Info says what the device is, as its descriptors do.
	Info() Info
	// Control runs a control transfer on endpoint 0. For a request from
	// the host (OUT), data is its data stage; for one to the host (IN),
	// it returns at most setup.Length bytes.
	Control(ctx context.Context, setup Setup, data []byte) ([]byte, error)
	// Transfer runs a bulk or interrupt transfer on endpoint ep (its
	// number, with 0x80 set for IN). OUT sends data; IN returns at most
	// length bytes, waiting for them as the device would NAK until then.
	Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error)
}

// ErrStall is a transfer the device refused (a STALL handshake): a
// request it does not know, or an endpoint it does not have.
var ErrStall = errors.New("the device stalled the transfer")

// Speed is a device's bus speed, numbered as Linux's enum usb_device_speed.
type Speed uint32

const (
	SpeedLow  Speed = 1
	SpeedFull Speed = 2
	SpeedHigh Speed = 3
)

// Interface is one interface of the device's configuration.
type Interface struct{ Class, SubClass, Protocol uint8 }

// Info is what a device says it is.
type Info struct {
	Vendor, Product, BCDDevice uint16
	Class, SubClass, Protocol  uint8
	Configuration              uint8 // the configuration's value
	Speed                      Speed
	Interfaces                 []Interface
	Serial                     string
}

// Setup is a control transfer's setup packet.
type Setup struct {
	RequestType, Request uint8
	Value, Index, Length uint16
}

// In reports whether the request's data stage is to the host.
func (s Setup) In() bool { return s.RequestType&0x80 != 0 }

// ParseSetup reads the 8 bytes of a setup packet (little-endian, as on
// the bus).
func ParseSetup(b [8]byte) Setup {
	return Setup{RequestType: b[0], Request: b[1], Value: binary.LittleEndian.Uint16(b[2:]),
		Index: binary.LittleEndian.Uint16(b[4:]), Length: binary.LittleEndian.Uint16(b[6:])}
}

// Bytes is the setup packet as on the bus.
func (s Setup) Bytes() [8]byte {
	var b [8]byte
	b[0], b[1] = s.RequestType, s.Request
	binary.LittleEndian.PutUint16(b[2:], s.Value)
	binary.LittleEndian.PutUint16(b[4:], s.Index)
	binary.LittleEndian.PutUint16(b[6:], s.Length)
	return b
}

// Standard requests and descriptor types (USB 2.0, chapter 9).
const (
	RequestGetStatus        = 0x00
	RequestClearFeature     = 0x01
	RequestSetFeature       = 0x03
	RequestSetAddress       = 0x05
	RequestGetDescriptor    = 0x06
	RequestGetConfiguration = 0x08
	RequestSetConfiguration = 0x09
	RequestGetInterface     = 0x0a
	RequestSetInterface     = 0x0b

	DescriptorDevice        = 1
	DescriptorConfiguration = 2
	DescriptorString        = 3
)
