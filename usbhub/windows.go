package usbhub

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// winDevice is a USB device as Windows' SetupAPI describes it.
type winDevice struct {
	InstanceID   string   // USB\VID_096E&PID_0702\IC0001
	LocationPath string   // PCIROOT(0)#PCI(1400)#USBROOT(0)#USB(3)#USB(2)
	Manufacturer string   // SPDRP_MFG
	Description  string   // SPDRP_DEVICEDESC
	Service      string   // SPDRP_SERVICE: the driver
	HardwareIDs  []string // USB\VID_096E&PID_0702&REV_0100, …
}

// winSource lists the USB devices Windows knows; SetupAPI on Windows, a
// fake in tests.
type winSource interface {
	usbDevices() ([]winDevice, error)
}

// Windows reads the inventory from SetupAPI without opening any device.
// Ports are named as on Linux ("1-3.2"): buses by the order of the USB
// root hubs' location paths, ports from the path's USB(n) steps. Windows
// cannot switch a port's power here.
type Windows struct {
	src winSource
}

var (
	winVIDPID = regexp.MustCompile(`(?i)^USB\\VID_([0-9A-F]{4})&PID_([0-9A-F]{4})(?:&[^\\]*)?\\(.+)$`)
	winStep   = regexp.MustCompile(`^USB\((\d{1,3})\)$`)
)

// Devices lists the USB devices Windows knows, by port.
func (w Windows) Devices(context.Context) ([]Device, error) {
	raw, err := w.src.usbDevices()
	if err != nil {
		return nil, err
	}
	// Buses: one per root hub, numbered in the order of their paths.
	roots := map[string]bool{}
	for _, d := range raw {
		if root, _, ok := splitWinLocation(d.LocationPath); ok {
			roots[root] = true
		}
	}
	order := make([]string, 0, len(roots))
	for r := range roots {
		order = append(order, r)
	}
	sort.Strings(order)
	bus := map[string]int{}
	for i, r := range order {
		bus[r] = i + 1
	}
	var out []Device
	for _, d := range raw {
		dev, ok := winToDevice(d, bus)
		if ok {
			out = append(out, dev)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

// splitWinLocation splits a location path at its root hub:
// "PCIROOT(0)#PCI(1400)#USBROOT(0)" and the ports below it.
func splitWinLocation(loc string) (root string, ports []int, ok bool) {
	parts := strings.Split(loc, "#")
	for i, p := range parts {
		if strings.HasPrefix(p, "USBROOT(") {
			root = strings.Join(parts[:i+1], "#")
			for _, step := range parts[i+1:] {
				m := winStep.FindStringSubmatch(step)
				if m == nil {
					return "", nil, false
				}
				n, _ := strconv.Atoi(m[1])
				ports = append(ports, n)
			}
			return root, ports, len(ports) > 0 && len(ports) <= 7
		}
	}
	return "", nil, false
}

// winToDevice turns what SetupAPI says into a Device; interfaces of
// composite devices and unreadable entries are skipped.
func winToDevice(d winDevice, bus map[string]int) (Device, bool) {
	m := winVIDPID.FindStringSubmatch(d.InstanceID)
	if m == nil || strings.Contains(d.InstanceID, "&MI_") {
		return Device{}, false
	}
	root, ports, ok := splitWinLocation(d.LocationPath)
	if !ok {
		return Device{}, false
	}
	port := strconv.Itoa(bus[root]) + "-" + strconv.Itoa(ports[0])
	for _, p := range ports[1:] {
		port += "." + strconv.Itoa(p)
	}
	serial := m[3]
	// Windows makes up an instance ID like 5&2a3c17d&0&3 for a device
	// without a serial number.
	if strings.Contains(serial, "&") {
		serial = ""
	}
	return Device{Port: port, Bus: bus[root], VendorID: strings.ToLower(m[1]), ProductID: strings.ToLower(m[2]),
		Serial: cleanDescriptor(serial), Manufacturer: cleanDescriptor(d.Manufacturer), Product: cleanDescriptor(d.Description),
		Class: winClass(d.Service)}, true
}

// winClass tells the class from the driver Windows bound.
func winClass(service string) Class {
	switch strings.ToLower(service) {
	case "usbccid", "wudfrd", "scfilter":
		return ClassSmartCard
	case "hidusb":
		return ClassHID
	case "usbhub", "usbhub3":
		return ClassHub
	case "usbstor", "uaspstor":
		return ClassStorage
	}
	return ClassOther
}

// PowerCycle: SetupAPI cannot switch a hub port's power.
func (w Windows) PowerCycle(_ context.Context, port string) error {
	return fmt.Errorf("%w (port %s on Windows)", ErrNotSwitchable, port)
}
