package usbhub

import (
	"reflect"
	"testing"
)

func TestPerPortPower(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		desc       []byte
		individual bool
		ports      int
		bad        bool
	}{
		{desc: []byte{9, 0x29, 4, 0x09, 0x00, 50, 100, 0, 0xff}, individual: true, ports: 4}, // per-port switching
		{desc: []byte{9, 0x29, 7, 0x00, 0x00, 50, 100, 0, 0xff}, ports: 7},                   // ganged
		{desc: []byte{12, 0x2a, 4, 0x01, 0x00, 50, 10, 0, 0, 0, 0, 0}, individual: true, ports: 4},
		{desc: []byte{9, 0x01, 4, 0x01, 0x00, 0, 0, 0, 0}, bad: true},
		{desc: []byte{3, 0x29, 4}, bad: true},
		{desc: []byte{200, 0x29, 4, 1, 0}, bad: true},
	} {
		ind, ports, err := perPortPower(c.desc)
		if (err != nil) != c.bad || ind != c.individual || (!c.bad && ports != c.ports) {
			t.Errorf("perPortPower(%x) = %v %d %v", c.desc, ind, ports, err)
		}
	}
}

func TestSplitPort(t *testing.T) {
	t.Parallel()
	bus, hub, n, err := splitPort("1-2.3.4")
	if err != nil || bus != 1 || !reflect.DeepEqual(hub, []int{2, 3}) || n != 4 {
		t.Fatalf("%d %v %d %v", bus, hub, n, err)
	}
	if bus, hub, n, err := splitPort("2-5"); err != nil || bus != 2 || len(hub) != 0 || n != 5 {
		t.Fatalf("root port: %d %v %d %v", bus, hub, n, err)
	}
	for _, bad := range []string{"", "1", "1-", "x-1", "1-2..3", "../1-2"} {
		if _, _, _, err := splitPort(bad); err == nil {
			t.Errorf("splitPort(%q) accepted", bad)
		}
	}
}
