package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/agent/runtime/process"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/usbhub"
)

// TestKeyRegistryFollowsTheBoxes: two boxes with simulated hubs report
// their keys; the console's registry follows plug, unplug, re-plug and a
// stuck key within 2 s; identical keys are told apart; leases are
// exclusive and reach the box's desired state; the history says who held
// which key, when.
func TestKeyRegistryFollowsTheBoxes(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	icbc := usbhub.Device{VendorID: "096e", ProductID: "0702", Serial: "IC0001", Manufacturer: "Feitian", Product: "ICBC U-Key", Class: usbhub.ClassSmartCard}
	twin := icbc
	twin.Serial = "IC0002"
	simA, err := usbhub.NewSim(usbhub.SimConfig{Hubs: []usbhub.SimHub{{Port: "1-1"}}}) // a stuck key stays stuck
	if err != nil {
		t.Fatal(err)
	}
	simB, _ := usbhub.NewSim(usbhub.SimConfig{})
	a, b := enrollOne(t, h, "keys-a"), enrollOne(t, h, "keys-b")
	testenv.StartAgent(t, a, func(c *agent.Config) { c.USB = simA; c.USBPoll = 100 * time.Millisecond })
	testenv.StartAgent(t, b, func(c *agent.Config) { c.USB = simB; c.USBPoll = 100 * time.Millisecond })
	admin := h.Admin()

	keysOf := func(box string) map[string]api.Key {
		ks, err := admin.Keys(ctx(t), box, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]api.Key{}
		for _, k := range ks {
			out[k.Port] = k
		}
		return out
	}
	within2s := func(what string, cond func() bool) {
		t.Helper()
		if took := testenv.WaitFor(t, 10*time.Second, what, cond); took > 2*time.Second {
			t.Errorf("%s took %s (goal 2 s)", what, took)
		}
	}
	// Let the boxes connect before timing the registry.
	testenv.WaitFor(t, 20*time.Second, "boxes online", func() bool {
		return testenv.BoxState(t, h, a.ID()).Online && testenv.BoxState(t, h, b.ID()).Online
	})

	icbc.Port, twin.Port = "1-1.1", "1-1.2"
	simA.Plug(icbc)
	simA.Plug(twin)
	within2s("two identical keys listed", func() bool { k := keysOf(a.ID()); return len(k) == 2 && k["1-1.1"].State == "present" })
	ks := keysOf(a.ID())
	key, other := ks["1-1.1"], ks["1-1.2"]
	if key.ID == other.ID || key.Serial != "IC0001" || other.Serial != "IC0002" {
		t.Fatalf("identical keys not told apart: %+v %+v", key, other)
	}
	if len(keysOf(b.ID())) != 0 {
		t.Fatal("box b has keys it never reported")
	}
	if _, err := admin.LabelKey(ctx(t), key.ID, map[string]string{"bank": "icbc", "company": "acme"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := admin.Keys(ctx(t), "", map[string]string{"bank": "icbc"}); len(got) != 1 || got[0].ID != key.ID {
		t.Fatalf("keys with bank=icbc: %+v", got)
	}

	// Exclusive leases.
	if _, err := admin.Lease(ctx(t), key.ID, "robot-1"); err != nil {
		t.Fatal(err)
	}
	_, err = admin.Lease(ctx(t), key.ID, "robot-2")
	var se *api.StatusError
	if !errors.As(err, &se) || se.Status != 409 || !strings.Contains(se.Message, "robot-1") {
		t.Fatalf("a second lease: %v", err)
	}
	st, _ := admin.BoxState(ctx(t), a.ID())
	found := false
	for _, o := range st.Objects {
		found = found || (o.Kind == "UsbAssignment" && strings.Contains(string(o.Spec), "robot-1") && strings.Contains(string(o.Spec), key.ID))
	}
	if !found {
		t.Fatalf("the lease is not in the box's desired state: %+v", st.Objects)
	}

	// Unplug, re-plug elsewhere, get stuck: the registry follows, the
	// lease stays with the key.
	simA.Unplug("1-1.1")
	within2s("unplugged", func() bool { return keysOf(a.ID())["1-1.1"].State == "absent" })
	icbc.Port = "1-1.3"
	simA.Plug(icbc)
	within2s("back at another port", func() bool { k := keysOf(a.ID())["1-1.3"]; return k.ID == key.ID && k.State == "present" })
	simA.SetStuck("1-1.3", true)
	within2s("stuck", func() bool { return keysOf(a.ID())["1-1.3"].State == "stuck" })
	if k := keysOf(a.ID())["1-1.3"]; k.Holder != "robot-1" {
		t.Fatalf("the lease did not follow the key: %+v", k)
	}

	if _, err := admin.Release(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Lease(ctx(t), key.ID, "robot-2"); err != nil {
		t.Fatalf("lease after release: %v", err)
	}
	hist, err := admin.KeyHistory(ctx(t), key.ID)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, e := range hist.Events {
		// The box power-cycles the stuck key on its own (see
		// TestStuckKeysHealThemselves); this test follows the rest.
		if !strings.HasPrefix(e.Event, "power-cycle") && e.Event != "recovered" && e.Event != "broken" {
			events = append(events, e.Event+":"+e.Workload)
		}
	}
	want := "plugged:,label:,lease:robot-1,unplugged:robot-1,plugged:robot-1,stuck:robot-1,release:robot-1,lease:robot-2"
	if got := strings.Join(events, ","); got != want {
		t.Fatalf("history:\n got %s\nwant %s", got, want)
	}
}

// TestDeployLeasesTheKeysAReleaseNeeds: a release that needs a bank=icbc
// key gets one of the box's free ones on deploy; a second app needing one
// more is told there is none; undeploying the first hands its key back.
func TestDeployLeasesTheKeysAReleaseNeeds(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	sim, _ := usbhub.NewSim(usbhub.SimConfig{Keys: []usbhub.Device{{Port: "1-1", VendorID: "096e", ProductID: "0702", Serial: "IC1", Class: usbhub.ClassSmartCard}}})
	box := enrollOne(t, h, "bank-box")
	testenv.StartAgent(t, box, func(c *agent.Config) { c.USB = sim; c.USBPoll = 100 * time.Millisecond })
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
	for _, app := range []string{"statements", "payroll"} {
		if _, err := admin.CreateApp(ctx(t), app, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CreateRelease(ctx(t), app, api.ReleaseSpec{Version: "1", Runtime: "process", Image: "/bin/sh",
			Keys: []api.KeyNeed{{Labels: map[string]string{"bank": "icbc"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := admin.Deploy(ctx(t), "statements", "1", "box", box.ID())
	if err != nil || len(r.Problems) != 0 {
		t.Fatalf("deploy: %+v %v", r, err)
	}
	if ks, _ := admin.Keys(ctx(t), box.ID(), nil); ks[0].Holder != "statements" {
		t.Fatalf("the key is not leased to statements: %+v", ks[0])
	}
	r, err = admin.Deploy(ctx(t), "payroll", "1", "box", box.ID())
	if err != nil || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "no free key with bank=icbc for payroll") {
		t.Fatalf("deploy of a second app needing the key: %+v %v", r, err)
	}
	if _, err := admin.Undeploy(ctx(t), "statements", "box", box.ID()); err != nil {
		t.Fatal(err)
	}
	// The key goes back, and on to the app that was waiting for it.
	if ks, _ := admin.Keys(ctx(t), box.ID(), nil); ks[0].Holder != "payroll" {
		t.Fatalf("after undeploying statements the key is held by %q, want payroll", ks[0].Holder)
	}
	if _, err := admin.Release(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	// Released by hand while payroll still needs it: payroll takes it again.
	if ks, _ := admin.Keys(ctx(t), box.ID(), nil); ks[0].Holder != "payroll" {
		t.Fatalf("after a release the key is held by %q, want payroll again", ks[0].Holder)
	}
}

// TestStuckKeysHealThemselves: a leased key that stops answering is
// power-cycled by its box and works again; one that stays stuck is
// cycled three times, then reported broken.
func TestStuckKeysHealThemselves(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	sim, _ := usbhub.NewSim(usbhub.SimConfig{Hubs: []usbhub.SimHub{{Port: "1-1", Switchable: true}},
		Keys: []usbhub.Device{{Port: "1-1.1", VendorID: "096e", ProductID: "0702", Serial: "OK1"},
			{Port: "1-1.2", VendorID: "096e", ProductID: "0702", Serial: "DEAD1"}}})
	box := enrollOne(t, h, "healing-box")
	testenv.StartAgent(t, box, func(c *agent.Config) { c.USB = sim; c.USBPoll = 100 * time.Millisecond })
	admin := h.Admin()
	bySerial := func() map[string]api.Key {
		ks, _ := admin.Keys(ctx(t), box.ID(), nil)
		out := map[string]api.Key{}
		for _, k := range ks {
			out[k.Serial] = k
		}
		return out
	}
	testenv.WaitFor(t, 20*time.Second, "keys reported", func() bool { return len(bySerial()) == 2 })
	ks := bySerial()
	for serial, w := range map[string]string{"OK1": "robot-a", "DEAD1": "robot-b"} {
		if _, err := admin.Lease(ctx(t), ks[serial].ID, w); err != nil {
			t.Fatal(err)
		}
	}
	// The lease must be on the box before it heals anything.
	testenv.WaitFor(t, 20*time.Second, "leases on the box", func() bool {
		s, err := admin.BoxState(ctx(t), box.ID())
		return err == nil && s.Acked >= s.Revision && len(s.Objects) == 2
	})
	sim.SetStuck("1-1.1", true)
	sim.SetDead("1-1.2", true)
	events := func(id string) string {
		hist, _ := admin.KeyHistory(ctx(t), id)
		var ev []string
		for _, e := range hist.Events {
			ev = append(ev, e.Event)
		}
		return strings.Join(ev, ",")
	}
	testenv.WaitFor(t, 20*time.Second, "the stuck key healed", func() bool {
		k := bySerial()["OK1"]
		return k.State == "present" && strings.Contains(events(k.ID), "stuck,power-cycle")
	})
	testenv.WaitFor(t, 40*time.Second, "the dead key reported broken", func() bool { return bySerial()["DEAD1"].Broken })
	if got := strings.Count(events(ks["DEAD1"].ID), "power-cycle"); got != 3 {
		t.Fatalf("the dead key was power-cycled %d times, want 3: %s", got, events(ks["DEAD1"].ID))
	}
}

// TestUnhealthyHolderPowerCyclesItsKey: when the workload holding a key
// fails its probe, its box power-cycles the key too, a common cure for a
// key that hangs without saying so.
func TestUnhealthyHolderPowerCyclesItsKey(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	sim, _ := usbhub.NewSim(usbhub.SimConfig{Hubs: []usbhub.SimHub{{Port: "1-1", Switchable: true}},
		Keys: []usbhub.Device{{Port: "1-1.1", VendorID: "096e", ProductID: "0702", Serial: "HANG1"}}})
	box := enrollOne(t, h, "probe-box")
	testenv.StartAgent(t, box, func(c *agent.Config) {
		c.USB, c.USBPoll = sim, 100*time.Millisecond
		c.Drivers = []runtime.Driver{fake.New("containerd")}
		c.Reconcile = 200 * time.Millisecond
	})
	admin := h.Admin()
	var key api.Key
	testenv.WaitFor(t, 20*time.Second, "the key reported", func() bool {
		ks, _ := admin.Keys(ctx(t), box.ID(), nil)
		if len(ks) == 1 {
			key = ks[0]
		}
		return key.ID != ""
	})
	// A probe that always fails: nothing listens on port 1.
	spec := []byte(`{"app":"robot","runtime":"containerd","image":"x","probes":[{"tcp":"127.0.0.1:1","period_seconds":1,"failure_threshold":1}]}`)
	if _, err := admin.PutDesired(ctx(t), box.ID(), "Workload", "robot", spec); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Lease(ctx(t), key.ID, "robot"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the key power-cycled for its unhealthy holder", func() bool {
		hist, _ := admin.KeyHistory(ctx(t), key.ID)
		for _, e := range hist.Events {
			if e.Event == "power-cycle" && strings.Contains(e.Detail, "unhealthy") {
				return true
			}
		}
		return false
	})
}

// TestSimulatedKeyLeasedToAProcess: a simulated key (what --usb-sim gives
// demos) has a device node in the agent's data directory; leased to a
// running native program, the program is made again with the key, keeps
// running, and opens the node for reading and writing as its own user.
// Released, the node is root's again and the program can no longer open
// it; unplugged, the node is gone.
func TestSimulatedKeyLeasedToAProcess(t *testing.T) {
	t.Parallel()
	require.Root(t, "the process driver runs workloads under users of their own")
	h := testenv.NewInProcess(t, testenv.Options{})
	sim, err := usbhub.NewSim(usbhub.SimConfig{Keys: []usbhub.Device{{Port: "1-1", VendorID: "096e", ProductID: "0702", Serial: "SIM1", Class: usbhub.ClassSmartCard}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	box := enrollOne(t, h, "sim-key-box")
	// Workloads' users pass through the data directory to their homes
	// and keys, as they do on a box (the agent's data directory is o+x).
	for d := box.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	const firstUID = 650000
	drv, err := process.New(process.Config{StateDir: filepath.Join(box.DataDir(), "process"), FirstUID: firstUID})
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartAgent(t, box, func(c *agent.Config) {
		c.Drivers = []runtime.Driver{drv}
		c.USB, c.USBPoll = sim, 100*time.Millisecond
		c.Reconcile = time.Second
	})
	nodes := filepath.Join(box.DataDir(), "usb-sim")
	node := filepath.Join(nodes, "001", "002")
	// Every second, the program tries to open every key node it finds.
	script := `trap 'exit 0' TERM
while :; do
  for f in ` + nodes + `/*/*; do
    [ -e "$f" ] || continue
    if (exec 3<>"$f") 2>/dev/null; then echo "opened $f as $(id -u)"; else echo "refused $f as $(id -u)"; fi
  done
  echo tick
  sleep 1 & wait
done`
	spec, _ := json.Marshal(map[string]any{"app": "robot", "runtime": "process", "image": "/bin/sh", "args": []string{"-c", script}})
	admin := h.Admin()
	if _, err := admin.PutDesired(ctx(t), box.ID(), "Workload", "robot", spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		drv.Stop(context.Background(), "robot", time.Second)
		drv.Remove(context.Background(), "robot")
	})
	var key api.Key
	testenv.WaitFor(t, 20*time.Second, "the key reported", func() bool {
		ks, err := admin.Keys(ctx(t), box.ID(), nil)
		if err != nil || len(ks) != 1 {
			return false
		}
		key = ks[0]
		return true
	})
	// lastLine is the program's latest report about its keys.
	lastLine := func() string {
		var out bytes.Buffer
		drv.Logs(context.Background(), "robot", 2, &out)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) < 2 {
			return ""
		}
		return lines[0]
	}
	running := func() bool {
		s, err := admin.BoxState(ctx(t), box.ID())
		if err != nil {
			return false
		}
		for _, st := range s.Statuses {
			if st.Kind == "Workload" && st.Name == "robot" {
				return st.Phase == "Running"
			}
		}
		return false
	}
	testenv.WaitFor(t, 30*time.Second, "robot running without the key", func() bool {
		return running() && strings.HasPrefix(lastLine(), "refused "+node)
	})

	if _, err := admin.Lease(ctx(t), key.ID, "robot"); err != nil {
		t.Fatal(err)
	}
	var uid int
	testenv.WaitFor(t, 30*time.Second, "robot opening its key", func() bool {
		_, err := fmt.Sscanf(lastLine(), "opened "+node+" as %d", &uid)
		return err == nil && running()
	})
	var st syscall.Stat_t
	if err := syscall.Stat(node, &st); err != nil {
		t.Fatal(err)
	}
	if uid < firstUID || int(st.Uid) != uid || st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		t.Fatalf("robot runs as %d; the node is owned by %d, mode %o", uid, st.Uid, st.Mode)
	}
	// It keeps running with its key.
	time.Sleep(3 * time.Second)
	if !running() || !strings.HasPrefix(lastLine(), "opened "+node) {
		t.Fatalf("after 3 s: running %v, %q", running(), lastLine())
	}
	s, err := admin.BoxState(ctx(t), box.ID())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range s.Events {
		if e.Warning && e.Name == "robot" {
			t.Errorf("a warning about robot: %s: %s", e.Reason, e.Message)
		}
	}

	if _, err := admin.Release(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "robot without its key", func() bool {
		return running() && strings.HasPrefix(lastLine(), "refused "+node)
	})
	if err := syscall.Stat(node, &st); err != nil || st.Uid != 0 {
		t.Fatalf("the released node: %v, owner %d", err, st.Uid)
	}
	if err := sim.Unplug("1-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(node); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the node of an unplugged key: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "robot finding no key", func() bool { return running() && lastLine() == "tick" })
}

// TestSimulatedKeyIsNotGivenToAVM: a simulated key has no USB device
// behind it for QEMU to attach: leased to a VM workload, the VM is not
// made again with it, and the box says why, once, as a warning.
func TestSimulatedKeyIsNotGivenToAVM(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	sim, _ := usbhub.NewSim(usbhub.SimConfig{Keys: []usbhub.Device{{Port: "1-1", VendorID: "096e", ProductID: "0702", Serial: "SIMVM"}}})
	t.Cleanup(func() { sim.Close() })
	box := enrollOne(t, h, "sim-vm-box")
	vms := fake.New("qemu") // what the agent gives its driver, not QEMU, is under test
	testenv.StartAgent(t, box, func(c *agent.Config) {
		c.Drivers = []runtime.Driver{vms}
		c.USB, c.USBPoll = sim, 100*time.Millisecond
		c.Reconcile = 200 * time.Millisecond
	})
	admin := h.Admin()
	if _, err := admin.PutDesired(ctx(t), box.ID(), "Workload", "vm", spec("vm", "1.0", "qemu")); err != nil {
		t.Fatal(err)
	}
	var key api.Key
	testenv.WaitFor(t, 20*time.Second, "the key reported and the VM running", func() bool {
		ks, _ := admin.Keys(ctx(t), box.ID(), nil)
		if len(ks) == 1 {
			key = ks[0]
		}
		return key.ID != "" && len(vms.Running()) == 1
	})
	creates := vms.Calls("create")
	if _, err := admin.Lease(ctx(t), key.ID, "vm"); err != nil {
		t.Fatal(err)
	}
	warnings := func() []api.Event {
		s, _ := admin.BoxState(ctx(t), box.ID())
		var out []api.Event
		for _, e := range s.Events {
			if e.Reason == "NotAttachable" {
				out = append(out, e)
			}
		}
		return out
	}
	testenv.WaitFor(t, 20*time.Second, "the box saying the key cannot go to the VM", func() bool { return len(warnings()) > 0 })
	time.Sleep(time.Second) // many reconcile passes and inventory reads
	w := warnings()
	if len(w) != 1 || !w[0].Warning || w[0].Name != key.ID || !strings.Contains(w[0].Message, "simulated key at 1-1 cannot be given to VM workload vm") {
		t.Fatalf("warnings: %+v", w)
	}
	if got := vms.Calls("create"); got != creates {
		t.Fatalf("the VM was made again %d times for a key it cannot have", got-creates)
	}
}
