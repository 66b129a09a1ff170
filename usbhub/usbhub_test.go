package usbhub

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// sysfsTree writes a /sys/bus/usb/devices as Linux lays it out: a root
// hub, an external hub with per-port power control, a CCID bank key in
// its port 3 and a HID key in its port 4 (this machine's kernel has no USB,
// so the tree is written by the test; the parser is the real one).
func sysfsTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(path, v string) {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("usb1/idVendor", "1d6b") // root hub: not listed
	write("usb1/bDeviceClass", "09")
	write("1-2/idVendor", "05e3")
	write("1-2/idProduct", "0610")
	write("1-2/bDeviceClass", "09")
	write("1-2/busnum", "1")
	write("1-2/devnum", "3")
	write("1-2:1.0/bInterfaceClass", "09") // an interface: not listed
	write("1-2/1-2:1.0/1-2-port3/disable", "0")
	write("1-2.3/idVendor", "096e")
	write("1-2.3/idProduct", "0702")
	write("1-2.3/serial", "ICBC-0001")
	write("1-2.3/manufacturer", "Feitian")
	write("1-2.3/product", "ePass2003")
	write("1-2.3/bDeviceClass", "00")
	write("1-2.3/busnum", "1")
	write("1-2.3/devnum", "7")
	write("1-2.3:1.0/bInterfaceClass", "0b")
	write("1-2.4/idVendor", "1050")
	write("1-2.4/idProduct", "0407")
	write("1-2.4/bDeviceClass", "00")
	write("1-2.4:1.0/bInterfaceClass", "03")
	return root
}

func TestSysfsInventory(t *testing.T) {
	t.Parallel()
	root := sysfsTree(t)
	s := Sysfs{Root: root}
	devs, err := s.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 3 {
		t.Fatalf("devices: %+v", devs)
	}
	key := devs[1]
	want := Device{Port: "1-2.3", Bus: 1, Dev: 7, VendorID: "096e", ProductID: "0702", Serial: "ICBC-0001",
		Manufacturer: "Feitian", Product: "ePass2003", Class: ClassSmartCard, Switchable: true}
	if key != want {
		t.Fatalf("the bank key:\n got %+v\nwant %+v", key, want)
	}
	if devs[0].Class != ClassHub || devs[2].Class != ClassHID || devs[2].Switchable {
		t.Fatalf("hub and HID key: %+v %+v", devs[0], devs[2])
	}

	ctx := context.Background()
	if err := s.PowerCycle(ctx, "1-2.3"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "1-2/1-2:1.0/1-2-port3/disable")); string(b) != "0" {
		t.Fatalf("port 3 left with disable=%q", b)
	}
	if err := s.PowerCycle(ctx, "1-2.4"); !errors.Is(err, ErrNotSwitchable) {
		t.Fatalf("power-cycling a port without power control: %v", err)
	}
	if err := s.PowerCycle(ctx, "../../etc"); err == nil {
		t.Fatal("a port path that is not one was accepted")
	}
}

func TestSysfsWithoutUSB(t *testing.T) {
	t.Parallel()
	devs, err := Sysfs{Root: filepath.Join(t.TempDir(), "absent")}.Devices(context.Background())
	if err != nil || len(devs) != 0 {
		t.Fatalf("a kernel without USB: %v %v", devs, err)
	}
}

func TestDiff(t *testing.T) {
	t.Parallel()
	a := Device{Port: "1-2.3", VendorID: "096e", ProductID: "0702", Serial: "A"}
	b := Device{Port: "1-2.4", VendorID: "096e", ProductID: "0702", Serial: "B"}
	stuck := a
	stuck.Stuck = true
	other := a
	other.Serial = "C"
	for _, c := range []struct {
		name          string
		before, after []Device
		want          []EventType
	}{
		{"plug", nil, []Device{a}, []EventType{Plugged}},
		{"unplug", []Device{a, b}, []Device{b}, []EventType{Unplugged}},
		{"stuck", []Device{a}, []Device{stuck}, []EventType{Changed}},
		{"swapped in the same port", []Device{a}, []Device{other}, []EventType{Unplugged, Plugged}},
		{"nothing", []Device{a, b}, []Device{a, b}, nil},
	} {
		got := Diff(c.before, c.after)
		if len(got) != len(c.want) {
			t.Errorf("%s: %+v", c.name, got)
			continue
		}
		for i := range got {
			if got[i].Type != c.want[i] {
				t.Errorf("%s: %+v", c.name, got)
			}
		}
	}
}

func TestSimulatedHub(t *testing.T) {
	t.Parallel()
	s, err := NewSim(SimConfig{
		Hubs: []SimHub{{Port: "1-1", Switchable: true}, {Port: "1-2"}},
		Keys: []Device{
			{Port: "1-1.1", VendorID: "096e", ProductID: "0702", Serial: "ICBC-1"},
			{Port: "1-1.2", VendorID: "096e", ProductID: "0702", Serial: "ICBC-2"}, // identical model: told apart by serial and port
			{Port: "1-2.1", VendorID: "1050", ProductID: "0407", Serial: "CCB-1", Class: ClassHID},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var mu sync.Mutex
	var evs []Event
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(wctx, s, 10*time.Millisecond, func(e Event) { mu.Lock(); evs = append(evs, e); mu.Unlock() })
	}()
	count := func(typ EventType) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, e := range evs {
			if e.Type == typ {
				n++
			}
		}
		return n
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s", what)
			}
		}
	}
	waitFor("the first inventory", func() bool { return count(Plugged) == 3 })

	s.SetStuck("1-1.2", true)
	waitFor("the jam", func() bool { return count(Changed) == 1 })
	devs, _ := s.Devices(ctx)
	before := devs[1].Dev
	if err := s.PowerCycle(ctx, "1-1.2"); err != nil {
		t.Fatal(err)
	}
	devs, _ = s.Devices(ctx)
	if devs[1].Stuck || devs[1].Dev == before || !devs[1].Switchable {
		t.Fatalf("after a power cycle: %+v", devs[1])
	}
	if err := s.PowerCycle(ctx, "1-2.1"); !errors.Is(err, ErrNotSwitchable) {
		t.Fatalf("a hub without power switching: %v", err)
	}
	s.Unplug("1-2.1")
	waitFor("the unplug", func() bool { return count(Unplugged) == 1 })
	if err := s.Plug(Device{Port: "1-1.1", VendorID: "096e", ProductID: "0702"}); err == nil {
		t.Fatal("two keys in one port")
	}
	stop()
	<-done
}
