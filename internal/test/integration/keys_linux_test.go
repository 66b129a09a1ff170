//go:build linux

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/usbhub"
)

// TestSimulatedKeyReachesTheContainer: with no /dev/bus/usb of the test's
// own, a simulated key's node (made by the hub in the agent's data
// directory) is what a lease gives a container: it appears at
// /dev/bus/usb/001/002, and the container opens it for reading and
// writing; released, it is gone from the container.
func TestSimulatedKeyReachesTheContainer(t *testing.T) {
	d := testenv.Containerd(t, true)
	sim, err := usbhub.NewSim(usbhub.SimConfig{Keys: []usbhub.Device{{Port: "1-1", VendorID: "096e", ProductID: "0702", Serial: "CTR1"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "sim-ctr-box")
	testenv.StartAgent(t, box, func(c *agent.Config) {
		c.Drivers = []runtime.Driver{d}
		c.USB, c.USBPoll = sim, 100*time.Millisecond
		c.Reconcile = time.Second
	})
	admin := h.Admin()
	spec, _ := json.Marshal(map[string]any{"app": "robot", "runtime": "containerd", "image": ctrdtest.Image,
		"args": []string{"/bin/sh", "-c", "trap 'exit 0' TERM; while :; do " +
			"if [ -c /dev/bus/usb/001/002 ] && (exec 3<>/dev/bus/usb/001/002) 2>/dev/null; then echo key: open; else echo key: none; fi; " +
			"sleep 1 & wait; done"}})
	if _, err := admin.PutDesired(ctx(t), box.ID(), "Workload", "robot", spec); err != nil {
		t.Fatal(err)
	}
	var key api.Key
	testenv.WaitFor(t, 20*time.Second, "the key reported", func() bool {
		ks, err := admin.Keys(ctx(t), box.ID(), nil)
		if err == nil && len(ks) == 1 {
			key = ks[0]
		}
		return key.ID != ""
	})
	says := func(want string) {
		t.Helper()
		testenv.WaitFor(t, 60*time.Second, "the container saying "+want, func() bool {
			var out bytes.Buffer
			d.Logs(context.Background(), "robot", 1, &out)
			return strings.TrimSpace(out.String()) == want
		})
	}
	says("key: none")
	if _, err := admin.Lease(ctx(t), key.ID, "robot"); err != nil {
		t.Fatal(err)
	}
	says("key: open")
	if _, err := admin.Release(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	says("key: none")
}
