package usbhub

import (
	"context"
	"errors"
	"strings"
	"testing"
)

type fakeWin []winDevice

func (f fakeWin) usbDevices() ([]winDevice, error) { return f, nil }

// TestWindowsInventory: what SetupAPI says becomes the same Devices as on
// Linux: ports from location paths, buses by root hub, serials only where
// the key has one, composite interfaces and junk skipped.
func TestWindowsInventory(t *testing.T) {
	t.Parallel()
	w := Windows{src: fakeWin{
		{InstanceID: `USB\ROOT_HUB30\4&1a2b&0&0`, LocationPath: `PCIROOT(0)#PCI(1400)#USBROOT(0)`},
		{InstanceID: `USB\VID_05E3&PID_0610\6&2b3c&0&3`, LocationPath: `PCIROOT(0)#PCI(1400)#USBROOT(0)#USB(3)`, Service: "USBHUB3"},
		{InstanceID: `USB\VID_096E&PID_0702\IC0001`, LocationPath: `PCIROOT(0)#PCI(1400)#USBROOT(0)#USB(3)#USB(2)`,
			Manufacturer: "Feitian", Description: "ICBC U-Key\x00\x1b[31m", Service: "usbccid"},
		{InstanceID: `USB\VID_096E&PID_0702\7&3c4d&0&1`, LocationPath: `PCIROOT(0)#PCI(1400)#USBROOT(0)#USB(3)#USB(1)`, Service: "HidUsb"},
		{InstanceID: `USB\VID_096E&PID_0702&MI_00\8&1&0&0000`, LocationPath: `PCIROOT(0)#PCI(1400)#USBROOT(0)#USB(3)#USB(2)#USBMI(0)`},
		{InstanceID: `USB\VID_1234&PID_5678\S2`, LocationPath: `PCIROOT(0)#PCI(0D00)#USBROOT(0)#USB(1)`, Service: "USBSTOR"},
		{InstanceID: `USB\VID_ZZZZ&PID_0001\X`, LocationPath: `PCIROOT(0)#PCI(1400)#USBROOT(0)#USB(4)`},
		{InstanceID: `USB\VID_1111&PID_2222\Y`, LocationPath: `garbage`},
		{InstanceID: `USB\VID_1111&PID_2222\` + strings.Repeat("S", 400), LocationPath: `PCIROOT(0)#PCI(1400)#USBROOT(0)#USB(5)`},
	}}
	devs, err := w.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Device{}
	for _, d := range devs {
		got[d.Port] = d
	}
	key := got["2-3.2"]
	if key.VendorID != "096e" || key.ProductID != "0702" || key.Serial != "IC0001" || key.Class != ClassSmartCard ||
		key.Product != "ICBC U-Key[31m" || key.Bus != 2 {
		t.Errorf("the ICBC key: %+v", key)
	}
	if d := got["2-3.1"]; d.Serial != "" || d.Class != ClassHID {
		t.Errorf("a key without a serial: %+v", d)
	}
	if got["2-3"].Class != ClassHub || got["1-1"].Class != ClassStorage {
		t.Errorf("hub and storage: %+v %+v", got["2-3"], got["1-1"])
	}
	if d := got["2-5"]; len(d.Serial) > maxDescriptor {
		t.Errorf("a 400-byte serial kept whole")
	}
	if len(devs) != 5 {
		t.Errorf("%d devices, want 5 (root hub, interface, bad IDs and paths skipped): %+v", len(devs), devs)
	}
	if err := w.PowerCycle(context.Background(), "2-3.2"); !errors.Is(err, ErrNotSwitchable) {
		t.Errorf("power cycle on Windows: %v", err)
	}
}
