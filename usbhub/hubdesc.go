package usbhub

import (
	"context"
	"errors"
	"strconv"
	"strings"
)

// Hub class requests and features (USB 2.0 §11.24, USB 3.2 §10.16).
const (
	hubRequestType    = 0x23 // host to device, class, other (a port)
	hubClearFeature   = 0x01
	hubSetFeature     = 0x03
	hubFeaturePower   = 8 // PORT_POWER
	hubDescriptorUSB2 = 0x29
	hubDescriptorUSB3 = 0x2a
)

// PortPower switches hub ports' power with hub class requests; Sysfs
// uses it, when set, instead of the kernel's disable attribute.
type PortPower interface {
	// Switchable says whether the hub above port switches each port's
	// power on its own.
	Switchable(port string) bool
	PowerCycle(ctx context.Context, port string) error
}

// perPortPower reads a hub descriptor: whether the hub switches each
// port's power on its own (wHubCharacteristics bits 1:0 = 01), and how
// many ports it has.
func perPortPower(desc []byte) (individual bool, ports int, err error) {
	if len(desc) < 5 || int(desc[0]) > len(desc) || int(desc[0]) < 5 {
		return false, 0, errors.New("usbhub: hub descriptor too short")
	}
	if desc[1] != hubDescriptorUSB2 && desc[1] != hubDescriptorUSB3 {
		return false, 0, errors.New("usbhub: not a hub descriptor")
	}
	chars := uint16(desc[3]) | uint16(desc[4])<<8
	return chars&0x3 == 0x1, int(desc[2]), nil
}

// splitPort splits a port path "1-2.3" into its bus (1), the path of the
// hub above it ([2]; empty for the root hub) and its port number (3).
func splitPort(port string) (bus int, hub []int, n int, err error) {
	b, rest, ok := strings.Cut(port, "-")
	if !ok || !devName.MatchString(port) {
		return 0, nil, 0, errors.New("usbhub: " + port + " is not a port path like 1-2.3")
	}
	bus, _ = strconv.Atoi(b)
	var path []int
	for _, p := range strings.Split(rest, ".") {
		v, _ := strconv.Atoi(p)
		path = append(path, v)
	}
	return bus, path[:len(path)-1], path[len(path)-1], nil
}
