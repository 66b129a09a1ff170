//go:build linux

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/usbhub"
)

// TestLeasedKeyReachesTheContainer: an operator leases a key to a
// workload; the box's container is made again with that key's device node
// and no other; unplugged and plugged back (a new device number), the
// container follows the key.
func TestLeasedKeyReachesTheContainer(t *testing.T) {
	d := testenv.Containerd(t, true)
	// The box's /dev/bus/usb: a node for every device number the
	// simulated hub will give.
	devRoot := t.TempDir()
	os.MkdirAll(filepath.Join(devRoot, "001"), 0o755)
	for n := 2; n < 8; n++ {
		if err := unix.Mknod(filepath.Join(devRoot, "001", fmt.Sprintf("%03d", n)), unix.S_IFCHR|0o660, int(unix.Mkdev(189, uint32(n-1)))); err != nil {
			t.Fatal(err)
		}
	}
	icbc := usbhub.Device{Port: "1-1.1", VendorID: "096e", ProductID: "0702", Serial: "IC1"}
	abc := usbhub.Device{Port: "1-1.2", VendorID: "096e", ProductID: "0702", Serial: "AB1"}
	sim, _ := usbhub.NewSim(usbhub.SimConfig{Hubs: []usbhub.SimHub{{Port: "1-1"}}, Keys: []usbhub.Device{icbc, abc}})

	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "attach-box")
	testenv.StartAgent(t, box, func(c *agent.Config) {
		c.Drivers = []runtime.Driver{d}
		c.USB, c.USBPoll, c.USBDevRoot = sim, 100*time.Millisecond, devRoot
		c.Reconcile = time.Second
	})
	admin := h.Admin()
	spec, _ := json.Marshal(map[string]any{"app": "robot", "runtime": "containerd", "image": ctrdtest.Image,
		"args": []string{"/bin/sh", "-c", "trap 'exit 0' TERM; echo keys: $(ls /dev/bus/usb/001 2>/dev/null); while :; do sleep 1 & wait; done"}})
	if _, err := admin.PutDesired(ctx(t), box.ID(), "Workload", "robot", spec); err != nil {
		t.Fatal(err)
	}
	var key api.Key
	testenv.WaitFor(t, 20*time.Second, "keys reported", func() bool {
		ks, err := admin.Keys(ctx(t), box.ID(), nil)
		for _, k := range ks {
			if k.Serial == "IC1" {
				key = k
			}
		}
		return err == nil && key.ID != ""
	})
	sees := func(want string) {
		t.Helper()
		testenv.WaitFor(t, 60*time.Second, "the container sees "+want, func() bool {
			var out bytes.Buffer
			d.Logs(context.Background(), "robot", 1, &out)
			return strings.TrimSpace(out.String()) == strings.TrimSpace("keys: "+want)
		})
	}
	sees("") // no lease, no key
	if _, err := admin.Lease(ctx(t), key.ID, "robot"); err != nil {
		t.Fatal(err)
	}
	sees("002") // the ICBC key was plugged first: device 2
	sim.Unplug("1-1.1")
	sim.Plug(icbc) // back with a new device number
	sees("004")
	if _, err := admin.Release(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	sees("")
	// The key's history tells when the robot had it, from the box.
	testenv.WaitFor(t, 10*time.Second, "attach and detach in the key's history", func() bool {
		hist, err := admin.KeyHistory(ctx(t), key.ID)
		if err != nil {
			return false
		}
		var ev []string
		for _, e := range hist.Events {
			if e.Event == "attach" || e.Event == "detach" {
				ev = append(ev, e.Event)
			}
		}
		return strings.Join(ev, ",") == "attach,detach,attach,detach"
	})
}
