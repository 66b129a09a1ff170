//go:build linux

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/usbhub"
)

// TestAKeyInUseHoldsTheBox: a release that says its keys hold updates
// leases a simulated UKEY; while a process on the box has the key's node
// open, the box reports an update lock (which rollouts wait on) and its
// agent does not replace the workload; once the key is closed, the new
// release goes on.
func TestAKeyInUseHoldsTheBox(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	sim, err := usbhub.NewSim(usbhub.SimConfig{Keys: []usbhub.Device{{Port: "1-1", VendorID: "096e", ProductID: "0702", Serial: "INUSE1", Class: usbhub.ClassSmartCard}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	box := enrollOne(t, h, "key-in-use-box")
	drv := fake.New("process")
	testenv.StartAgent(t, box, func(c *agent.Config) {
		c.Drivers = []runtime.Driver{drv}
		c.USB, c.USBPoll = sim, 100*time.Millisecond
		c.Reconcile = time.Second
	})
	admin := h.Admin()
	var key api.Key
	testenv.WaitFor(t, 20*time.Second, "the key reported", func() bool {
		ks, err := admin.Keys(ctx(t), box.ID(), nil)
		if err != nil || len(ks) != 1 {
			return false
		}
		key = ks[0]
		return true
	})
	if _, err := admin.LabelKey(ctx(t), key.ID, map[string]string{"bank": "icbc"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateApp(ctx(t), "signer", ""); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1", "2"} {
		if _, err := admin.CreateRelease(ctx(t), "signer", api.ReleaseSpec{Version: v, Runtime: "process", Image: "/bin/signer",
			Keys: []api.KeyNeed{{Labels: map[string]string{"bank": "icbc"}}}, KeysHoldUpdates: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Deploy(ctx(t), "signer", "1", "box", box.ID()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "signer 1 running", func() bool { return drv.Copies("1") == 1 })

	status := func(kind, name string) api.ObjectStatus {
		st, _ := admin.BoxState(ctx(t), box.ID())
		for _, s := range st.Statuses {
			if s.Kind == kind && s.Name == name {
				return s
			}
		}
		return api.ObjectStatus{}
	}
	// The robot signs: the key's node is open.
	node := filepath.Join(box.DataDir(), "usb-sim", "001", "002")
	f, err := os.OpenFile(node, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	testenv.WaitFor(t, 20*time.Second, "the key in use reported", func() bool {
		s := status("UpdateLock", "ukey-signer")
		return s.Phase == "Running" && strings.Contains(s.Message, key.ID) && strings.Contains(s.Message, "in use by signer")
	})
	if _, err := admin.Deploy(ctx(t), "signer", "2", "box", box.ID()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "release 2 waiting for the key", func() bool {
		s := status("Workload", "signer")
		return s.Phase == "Pending" && strings.Contains(s.Message, "release 2 waits: UKEY")
	})
	time.Sleep(2 * time.Second)
	if drv.Copies("2") != 0 || drv.Copies("1") != 1 {
		t.Fatalf("the workload was replaced while its key was in use: %s", drv)
	}
	f.Close()
	defer func() {
		if t.Failed() {
			st, _ := admin.BoxState(ctx(t), box.ID())
			t.Logf("statuses %+v; driver %s", st.Statuses, drv)
		}
	}()
	testenv.WaitFor(t, 20*time.Second, "release 2 running once the key is closed", func() bool {
		return drv.Copies("2") == 1 && status("UpdateLock", "ukey-signer").Kind == ""
	})
}
