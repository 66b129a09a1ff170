// Package usbhub is the box's view of its USB keys: what is plugged where,
// told apart by vendor, product, serial and hub port path; hot-plug events;
// and power-cycling a port, for the hubs that can switch one. Inventory
// never opens a device. On Linux it reads sysfs; the simulated hub (sim)
// stands behind the same interface for boxes and demos without hardware.
package usbhub

import (
	"context"
	"errors"
	"sort"
	"strings"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Class is what a device presents itself as.
type Class string

const (
	ClassSmartCard Class = "smartcard" // CCID readers: most bank keys
	ClassHID       Class = "hid"       // HID keys
	ClassHub       Class = "hub"
	ClassStorage   Class = "storage"
	ClassOther     Class = "other"
)

// Device is one USB device as the box sees it.
type Device struct {
	// Port is the hub port path, "1-2.3": bus 1, root port 2, port 3 of
	// the hub there. It stays the same when the key is re-plugged into
	// the same port; the bus and device numbers do not.
	Port         string `json:"port"`
	Bus          int    `json:"bus"`
	Dev          int    `json:"dev"`
	VendorID     string `json:"vendor_id"`  // 4 hex digits
	ProductID    string `json:"product_id"` // 4 hex digits
	Serial       string `json:"serial,omitempty"`
	Manufacturer string `json:"manufacturer,omitempty"`
	Product      string `json:"product,omitempty"`
	Class        Class  `json:"class"`
	// Switchable: the port it sits in can be power-cycled.
	Switchable bool `json:"switchable"`
	// Stuck: the device no longer answers (simulated hubs say so; real
	// ones are found stuck by their users).
	Stuck bool `json:"stuck,omitempty"`
	// Simulated: no USB device is behind it (the simulated hub's keys):
	// it has a device node, but nothing a VM could be given.
	Simulated bool `json:"-"`
	// Node is the device's node where the hub made it itself (the
	// simulated hub, after NodeMaker.MakeNodes); empty means the system's
	// /dev/bus/usb/BBB/DDD.
	Node string `json:"-"`
}

// EventType says what happened to a device.
type EventType string

const (
	Plugged   EventType = "plugged"
	Unplugged EventType = "unplugged"
	Changed   EventType = "changed" // same port, something else about it changed
)

// Event is one change of the inventory.
type Event struct {
	Type   EventType
	Device Device
}

// ErrNotSwitchable is returned for power-cycling a port whose hub cannot
// switch its power.
var ErrNotSwitchable = errors.New("usbhub: this port's hub cannot switch its power")

// ErrNoDevice is returned for a port with nothing in it.
var ErrNoDevice = errors.New("usbhub: no device at this port")

// Hub is a box's USB inventory.
type Hub interface {
	// Devices lists the devices plugged in, by port path.
	Devices(ctx context.Context) ([]Device, error)
	// PowerCycle turns the port off and on again.
	PowerCycle(ctx context.Context, port string) error
}

// Opener is a hub that opens its devices for an exporter of keys (the
// USB/IP server a key on this box is used from another box through): the
// simulated hub's keys are simulated CCID smart-card keys.
type Opener interface {
	// Open returns the device at port, to drive. Opening it again returns
	// the same device while it stays plugged in.
	Open(ctx context.Context, port string) (usbdev.Device, error)
}

// NodeMaker is a hub that makes its devices' nodes itself, in a directory
// the box gives it (the simulated hub: its keys have none in /dev).
// Devices then names each device's node in Device.Node. MakeNodes with the
// same directory again does nothing.
type NodeMaker interface {
	MakeNodes(dir string) error
}

// Diff returns the events that turn before into after, by port.
func Diff(before, after []Device) []Event {
	was := make(map[string]Device, len(before))
	for _, d := range before {
		was[d.Port] = d
	}
	var evs []Event
	for _, d := range after {
		old, ok := was[d.Port]
		switch {
		case !ok:
			evs = append(evs, Event{Plugged, d})
		case old != d:
			if old.VendorID != d.VendorID || old.ProductID != d.ProductID || old.Serial != d.Serial {
				// Another device in the same port.
				evs = append(evs, Event{Unplugged, old}, Event{Plugged, d})
			} else {
				evs = append(evs, Event{Changed, d})
			}
		}
		delete(was, d.Port)
	}
	var gone []Device
	for _, d := range was {
		gone = append(gone, d)
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].Port < gone[j].Port })
	for _, d := range gone {
		evs = append(evs, Event{Unplugged, d})
	}
	return evs
}

// maxDescriptor bounds a descriptor string the inventory keeps.
const maxDescriptor = 128

// cleanDescriptor keeps a device's self-description printable and short:
// a key may say anything about itself.
func cleanDescriptor(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, strings.ToValidUTF8(strings.TrimSpace(s), ""))
	if len(s) > maxDescriptor {
		s = strings.ToValidUTF8(s[:maxDescriptor], "")
	}
	return s
}
