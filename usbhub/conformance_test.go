package usbhub

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// harness is what an implementation of Hub gives the conformance suite:
// the hub, and ways to plug and unplug keys. Ports under switchable can be
// power-cycled; ports under fixed cannot.
type harness struct {
	hub               Hub
	plug              func(t *testing.T, d Device)
	unplug            func(t *testing.T, port string)
	switchable, fixed string
}

// conformance is the suite both the simulated hub and sysfs pass.
func conformance(t *testing.T, h harness) {
	ctx := context.Background()
	keys := func() map[string]Device {
		t.Helper()
		devs, err := h.hub.Devices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]Device{}
		for _, d := range devs {
			if d.Class != ClassHub {
				out[d.Port] = d
			}
		}
		return out
	}
	if n := len(keys()); n != 0 {
		t.Fatalf("%d keys before any was plugged", n)
	}
	a := Device{Port: h.switchable + ".3", VendorID: "096e", ProductID: "0702", Serial: "ICBC-1", Manufacturer: "Feitian", Product: "ePass2003", Class: ClassSmartCard}
	b := a
	b.Port, b.Serial = h.switchable+".4", "ICBC-2" // the same model: told apart by serial and port
	c := Device{Port: h.fixed + ".1", VendorID: "1050", ProductID: "0407", Class: ClassHID}
	for _, d := range []Device{a, b, c} {
		h.plug(t, d)
	}
	got := keys()
	for _, want := range []Device{a, b, c} {
		d, ok := got[want.Port]
		if !ok || d.VendorID != want.VendorID || d.ProductID != want.ProductID || d.Serial != want.Serial || d.Class != want.Class {
			t.Fatalf("at %s: %+v, want %+v", want.Port, d, want)
		}
	}
	if !got[a.Port].Switchable || got[c.Port].Switchable {
		t.Fatalf("switchable: %v at %s, %v at %s", got[a.Port].Switchable, a.Port, got[c.Port].Switchable, c.Port)
	}
	if got[a.Port].Manufacturer != "Feitian" || got[a.Port].Product != "ePass2003" {
		t.Fatalf("descriptor strings: %+v", got[a.Port])
	}
	if err := h.hub.PowerCycle(ctx, a.Port); err != nil {
		t.Fatalf("power cycle of a switchable port: %v", err)
	}
	if _, ok := keys()[a.Port]; !ok {
		t.Fatal("the key is gone after a power cycle")
	}
	if err := h.hub.PowerCycle(ctx, c.Port); !errors.Is(err, ErrNotSwitchable) {
		t.Fatalf("power cycle of a fixed port: %v", err)
	}
	if err := h.hub.PowerCycle(ctx, "../../etc"); err == nil {
		t.Fatal("power cycle of a made-up port")
	}
	before := keys()
	h.unplug(t, a.Port)
	evs := Diff(mapValues(before), mapValues(keys()))
	if len(evs) != 1 || evs[0].Type != Unplugged || evs[0].Device.Port != a.Port {
		t.Fatalf("events after an unplug: %+v", evs)
	}
	// A key may say anything about itself: it is kept short and printable.
	d := Device{Port: h.switchable + ".5", VendorID: "096e", ProductID: "0702", Serial: "S\x1b[2J" + strings.Repeat("x", 300),
		Product: strings.Repeat("\xff\x00é", 200), Class: ClassSmartCard}
	h.plug(t, d)
	k := keys()[d.Port]
	if len(k.Serial) > maxDescriptor || len(k.Product) > maxDescriptor || strings.ContainsAny(k.Serial+k.Product, "\x00\x1b") {
		t.Fatalf("absurd descriptors kept: %q %q", k.Serial, k.Product)
	}
}

func mapValues(m map[string]Device) []Device {
	out := make([]Device, 0, len(m))
	for _, d := range m {
		out = append(out, d)
	}
	return out
}

func TestConformanceSim(t *testing.T) {
	t.Parallel()
	s, err := NewSim(SimConfig{Hubs: []SimHub{{Port: "1-2", Switchable: true}, {Port: "1-3"}}})
	if err != nil {
		t.Fatal(err)
	}
	conformance(t, harness{hub: s, switchable: "1-2", fixed: "1-3",
		plug: func(t *testing.T, d Device) {
			if err := s.Plug(d); err != nil {
				t.Fatal(err)
			}
		},
		unplug: func(t *testing.T, port string) {
			if err := s.Unplug(port); err != nil {
				t.Fatal(err)
			}
		}})
}

// fakeSysfs lays out /sys/bus/usb/devices as Linux does, in a directory
// of the test's own: this machine's kernel has no USB.
type fakeSysfs struct {
	root string
	dev  int
}

func (f *fakeSysfs) write(t *testing.T, path, v string) {
	t.Helper()
	p := filepath.Join(f.root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// hub adds a hub at port; with switchable, its ports 1 to 7 have the
// kernel's disable attribute.
func (f *fakeSysfs) hub(t *testing.T, port string, switchable bool) {
	f.write(t, port+"/idVendor", "05e3")
	f.write(t, port+"/idProduct", "0610")
	f.write(t, port+"/bDeviceClass", "09")
	if switchable {
		for n := 1; n <= 7; n++ {
			f.write(t, fmt.Sprintf("%s/%s:1.0/%s-port%d/disable", port, port, port, n), "0")
		}
	}
}

func (f *fakeSysfs) plug(t *testing.T, d Device) {
	f.dev++
	cls := map[Class]string{ClassSmartCard: "0b", ClassHID: "03"}[d.Class]
	for name, v := range map[string]string{"idVendor": d.VendorID, "idProduct": d.ProductID, "serial": d.Serial,
		"manufacturer": d.Manufacturer, "product": d.Product, "bDeviceClass": "00", "busnum": "1", "devnum": fmt.Sprint(f.dev)} {
		if v != "" {
			f.write(t, d.Port+"/"+name, v)
		}
	}
	f.write(t, d.Port+":1.0/bInterfaceClass", cls)
}

func TestConformanceSysfs(t *testing.T) {
	t.Parallel()
	f := &fakeSysfs{root: t.TempDir()}
	f.write(t, "usb1/idVendor", "1d6b") // the root hub
	f.hub(t, "1-2", true)
	f.hub(t, "1-3", false)
	conformance(t, harness{hub: Sysfs{Root: f.root}, switchable: "1-2", fixed: "1-3", plug: f.plug,
		unplug: func(t *testing.T, port string) {
			os.RemoveAll(filepath.Join(f.root, port))
			os.RemoveAll(filepath.Join(f.root, port+":1.0"))
		}})
}

// TestSysfsMalformed: what a broken or racing sysfs holds is skipped, not
// reported: IDs that are not hex, a device gone between two reads,
// unreadable numbers.
func TestSysfsMalformed(t *testing.T) {
	t.Parallel()
	f := &fakeSysfs{root: t.TempDir()}
	f.write(t, "1-1/idVendor", "zzzz") // not hex
	f.write(t, "1-1/idProduct", "0001")
	f.write(t, "1-2/idProduct", "0702") // vanished: no idVendor any more
	f.write(t, "1-3/idVendor", "096e")
	f.write(t, "1-3/idProduct", "0702")
	f.write(t, "1-3/busnum", "one") // unreadable numbers stay 0
	f.write(t, "1-3/devnum", "\x00\x01")
	f.write(t, "1-4/idVendor", strings.Repeat("9", 5000))
	f.write(t, "1-4/idProduct", "0001")
	os.MkdirAll(filepath.Join(f.root, "not-a-device"), 0o755)
	devs, err := Sysfs{Root: f.root}.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Port != "1-3" || devs[0].Bus != 0 || devs[0].Dev != 0 {
		t.Fatalf("devices from a malformed sysfs: %+v", devs)
	}
}
