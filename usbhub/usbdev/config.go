package usbdev

import (
	"context"
	"encoding/binary"
	"fmt"
)

// Endpoint is one endpoint of a configuration, as its descriptor says.
type Endpoint struct {
	Address       uint8 // its number, with 0x80 for IN
	Type          uint8 // 1 isochronous, 2 bulk, 3 interrupt (the attributes' low bits)
	MaxPacketSize uint16
	Interval      uint8
	Interface     uint8 // the interface it belongs to
}

// InterfaceDesc is one interface of a configuration, at alternate
// setting 0.
type InterfaceDesc struct {
	Number                    uint8
	Class, SubClass, Protocol uint8
}

// Config is what a configuration descriptor says of its interfaces (at
// alternate setting 0) and their endpoints.
type Config struct {
	Value      uint8
	Interfaces []InterfaceDesc
	Endpoints  []Endpoint
}

// ParseConfig reads a whole configuration descriptor (wTotalLength bytes),
// checking every length in it.
func ParseConfig(b []byte) (Config, error) {
	if len(b) < 9 || b[1] != DescriptorConfiguration || b[0] < 9 {
		return Config{}, fmt.Errorf("usbdev: not a configuration descriptor")
	}
	total := int(binary.LittleEndian.Uint16(b[2:]))
	if total > len(b) || total < 9 {
		return Config{}, fmt.Errorf("usbdev: a configuration of %d bytes in %d", total, len(b))
	}
	c := Config{Value: b[5]}
	b = b[:total]
	alt0, iface := false, uint8(0)
	for i := int(b[0]); i < len(b); {
		n := int(b[i])
		if n < 2 || i+n > len(b) {
			return Config{}, fmt.Errorf("usbdev: a descriptor of %d bytes at %d of %d", n, i, len(b))
		}
		d := b[i : i+n]
		switch d[1] {
		case 4: // interface
			if n < 9 {
				return Config{}, fmt.Errorf("usbdev: an interface descriptor of %d bytes", n)
			}
			iface, alt0 = d[2], d[3] == 0
			if alt0 {
				c.Interfaces = append(c.Interfaces, InterfaceDesc{Number: d[2], Class: d[5], SubClass: d[6], Protocol: d[7]})
			}
		case 5: // endpoint
			if n < 7 {
				return Config{}, fmt.Errorf("usbdev: an endpoint descriptor of %d bytes", n)
			}
			if alt0 {
				c.Endpoints = append(c.Endpoints, Endpoint{Address: d[2], Type: d[3] & 3,
					MaxPacketSize: binary.LittleEndian.Uint16(d[4:]) & 0x7ff, Interval: d[6], Interface: iface})
			}
		}
		i += n
	}
	if len(c.Interfaces) > 32 || len(c.Endpoints) > 30 {
		return Config{}, fmt.Errorf("usbdev: %d interfaces and %d endpoints; at most 32 and 30", len(c.Interfaces), len(c.Endpoints))
	}
	return c, nil
}

// ReadConfig asks d for its configuration descriptor, whole, and reads
// it.
func ReadConfig(ctx context.Context, d Device) (Config, error) {
	get := func(n uint16) ([]byte, error) {
		return d.Control(ctx, Setup{RequestType: 0x80, Request: RequestGetDescriptor, Value: DescriptorConfiguration << 8, Length: n}, nil)
	}
	head, err := get(9)
	if err != nil {
		return Config{}, fmt.Errorf("usbdev: reading the configuration descriptor: %w", err)
	}
	if len(head) < 4 {
		return Config{}, fmt.Errorf("usbdev: a configuration descriptor of %d bytes", len(head))
	}
	all, err := get(binary.LittleEndian.Uint16(head[2:]))
	if err != nil {
		return Config{}, fmt.Errorf("usbdev: reading the configuration descriptor: %w", err)
	}
	return ParseConfig(all)
}
