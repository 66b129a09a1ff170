//go:build gousb && cgo && linux

package usbhub

import (
	"context"
	"errors"
	"testing"
)

// TestHubPowerWithoutUSB: libusb opens here, and with no USB in this
// machine's kernel it finds no hub: no port is switchable and a power
// cycle says so. On a box with hubs the same code sends the requests.
func TestHubPowerWithoutUSB(t *testing.T) {
	h := NewHubPower()
	defer h.Close()
	if h.Switchable("1-2.3") {
		t.Fatal("a port is switchable on a machine without USB")
	}
	if err := h.PowerCycle(context.Background(), "1-2.3"); !errors.Is(err, ErrNotSwitchable) {
		t.Fatalf("power cycle: %v", err)
	}
	s := Sysfs{Root: t.TempDir(), Power: h}
	if devs, err := s.Devices(context.Background()); err != nil || len(devs) != 0 {
		t.Fatalf("devices: %v %v", devs, err)
	}
}
