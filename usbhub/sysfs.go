package usbhub

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Sysfs reads the inventory from Linux's /sys/bus/usb/devices without
// opening any device.
type Sysfs struct {
	// Root is /sys/bus/usb/devices unless set.
	Root string
	// Power, when set, switches ports with hub class requests and says
	// which hubs switch each port on its own; without it the kernel's
	// per-port disable attribute does (the kernel sends the same
	// PORT_POWER requests, but cannot say whether a hub gangs its ports).
	Power PortPower
}

var _ Opener = Sysfs{}

// Open opens the key at port through Power, when that is libusb (an agent
// built with -tags gousb); otherwise it says why it cannot.
func (s Sysfs) Open(ctx context.Context, port string) (usbdev.Device, error) {
	if o, ok := s.Power.(Opener); ok {
		return o.Open(ctx, port)
	}
	return nil, errors.New("usbhub: this agent was built without libusb (-tags gousb), so it cannot drive its keys for other boxes")
}

func (s Sysfs) root() string {
	if s.Root == "" {
		return "/sys/bus/usb/devices"
	}
	return s.Root
}

// hexID is a vendor or product ID as sysfs writes it.
var hexID = regexp.MustCompile(`^[0-9a-fA-F]{4}$`)

// devName matches a device (not an interface, not a root hub): "1-2",
// "1-2.3.1".
var devName = regexp.MustCompile(`^[0-9]+-[0-9]+(\.[0-9]+)*$`)

func (s Sysfs) attr(dev, name string) string {
	b, err := os.ReadFile(filepath.Join(s.root(), dev, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Devices lists the devices in sysfs. A box whose kernel has no USB has
// none.
func (s Sysfs) Devices(context.Context) ([]Device, error) {
	entries, err := os.ReadDir(s.root())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []Device
	for _, e := range entries {
		name := e.Name()
		if !devName.MatchString(name) {
			continue
		}
		d := Device{Port: name, VendorID: s.attr(name, "idVendor"), ProductID: s.attr(name, "idProduct"),
			Serial: cleanDescriptor(s.attr(name, "serial")), Manufacturer: cleanDescriptor(s.attr(name, "manufacturer")),
			Product: cleanDescriptor(s.attr(name, "product"))}
		if !hexID.MatchString(d.VendorID) || !hexID.MatchString(d.ProductID) {
			continue // gone while we read it, or not a device we can name
		}
		d.VendorID, d.ProductID = strings.ToLower(d.VendorID), strings.ToLower(d.ProductID)
		d.Bus, _ = strconv.Atoi(s.attr(name, "busnum"))
		d.Dev, _ = strconv.Atoi(s.attr(name, "devnum"))
		d.Class = s.class(name)
		if s.Power != nil {
			d.Switchable = s.Power.Switchable(name)
		} else {
			_, err := os.Stat(s.portDisable(name))
			d.Switchable = err == nil
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

// class is the device class, or that of its first interface when the
// device defers to its interfaces (class 00).
func (s Sysfs) class(dev string) Class {
	c := s.attr(dev, "bDeviceClass")
	if c == "" || c == "00" {
		c = s.attr(dev+":1.0", "bInterfaceClass")
	}
	switch c {
	case "0b":
		return ClassSmartCard
	case "03":
		return ClassHID
	case "09":
		return ClassHub
	case "08":
		return ClassStorage
	}
	return ClassOther
}

// portDisable is the sysfs switch of the hub port dev sits in:
// <parent>/<parent>:1.0/<parent>-port<N>/disable, where the hub's driver
// offers per-port power control.
func (s Sysfs) portDisable(dev string) string {
	i := strings.LastIndexAny(dev, "-.")
	parent, n := dev[:i], dev[i+1:]
	if !strings.Contains(parent, "-") {
		parent = "usb" + parent // a root hub port: bus N's root hub is usbN
	}
	return filepath.Join(s.root(), parent, parent+":1.0", parent+"-port"+n, "disable")
}

// PowerCycle switches the port off for a second, then on.
func (s Sysfs) PowerCycle(ctx context.Context, port string) error {
	if !devName.MatchString(port) {
		return fmt.Errorf("usbhub: %q is not a port path like 1-2.3", port)
	}
	if s.Power != nil {
		return s.Power.PowerCycle(ctx, port)
	}
	p := s.portDisable(port)
	if _, err := os.Stat(p); err != nil {
		return ErrNotSwitchable
	}
	if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("usbhub: switching %s off: %w", port, err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
	if err := os.WriteFile(p, []byte("0"), 0o644); err != nil {
		return fmt.Errorf("usbhub: switching %s on again: %w", port, err)
	}
	return ctx.Err()
}
