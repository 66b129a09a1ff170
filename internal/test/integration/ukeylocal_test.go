package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/ccidtest"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/usbhub"
	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbip"
)

// TestARemoteKeyOfferedOnLoopback: a simulated key on box A, leased to a
// workload on box B that is not a VM (a program, here the fake driver's),
// is offered on B's loopback USB/IP server under its key ID: a USB/IP
// client imports it there, powers the card, selects its application and
// has it sign, through both tunnels and the console, and the signature
// verifies. The kernel project's usbip tool lists it. Releasing the lease
// takes it away: it is offered no more, and the client using it sees its
// transfers fail. Box B's agent then stops when asked to.
func TestARemoteKeyOfferedOnLoopback(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	sim, err := usbhub.NewSim(usbhub.SimConfig{Hubs: []usbhub.SimHub{{Port: "1-1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Plug(usbhub.Device{Port: "1-1.2", VendorID: "1050", ProductID: "0407", Serial: "UK-000456",
		Product: "bank UKEY", Class: usbhub.ClassSmartCard}); err != nil {
		t.Fatal(err)
	}
	hub, robot := enrollOne(t, h, "key-box"), enrollOne(t, h, "program-box")
	testenv.StartAgent(t, hub, func(c *agent.Config) {
		c.USB, c.USBPoll = sim, 100*time.Millisecond
		c.KeyServer = "off"
	})
	keyServer := testenv.FreeAddr(t)
	drv := fake.New("process")
	testenv.StartAgent(t, robot, func(c *agent.Config) {
		c.Drivers = []runtime.Driver{drv}
		c.Reconcile = time.Second
		c.KeyServer = keyServer
	})

	admin := h.Admin()
	if _, err := admin.CreateApp(ctx(t), "signer", "a program signing with a bank's UKEY on another box"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateRelease(ctx(t), "signer", api.ReleaseSpec{Version: "1", Runtime: "process", Image: "/bin/signer"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Deploy(ctx(t), "signer", "1", "box", robot.ID()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the signer running on box B", func() bool { return drv.Copies("1") == 1 })
	var key api.Key
	testenv.WaitFor(t, 20*time.Second, "the key listed", func() bool {
		ks, err := admin.Keys(ctx(t), hub.ID(), nil)
		if err == nil && len(ks) == 1 {
			key = ks[0]
		}
		return key.ID != ""
	})
	if _, err := admin.Attach(ctx(t), key.ID, "signer", robot.ID()); err != nil {
		t.Fatal(err)
	}

	// The key offered on B's loopback, under its ID: a client imports it
	// and has the card sign.
	var c *usbip.Client
	testenv.WaitFor(t, 20*time.Second, "the key offered on box B's loopback", func() bool {
		c, err = usbip.Dial(ctx(t), keyServer, key.ID)
		return err == nil || pause(100*time.Millisecond)
	})
	if i := c.Info(); i.Vendor != 0x1050 || i.Product != 0x0407 {
		t.Fatalf("the key offered on box B: %+v", i)
	}
	atr, err := ccidtest.PowerOn(ctx(t), c, 1)
	if err != nil || !strings.Contains(string(atr), "edgeboxkey") {
		t.Fatalf("power on: %x %v", atr, err)
	}
	if err := ccidtest.Select(ctx(t), c, 2); err != nil {
		t.Fatal(err)
	}
	if serial, err := ccidtest.APDU(ctx(t), c, 3, []byte{0x00, 0xCA, 0x00, 0x5A, 0x00}); err != nil || string(serial) != "UK-000456\x90\x00" {
		t.Fatalf("GET DATA serial: %q %v", serial, err)
	}
	msg := []byte("statement 2026-11, signed by a program on box B")
	if _, err := ccidtest.Sign(ctx(t), c, 4, msg); err != nil {
		t.Fatal(err)
	}
	if ks, _ := admin.Keys(ctx(t), hub.ID(), nil); len(ks) != 1 || ks[0].Holder != "signer" || ks[0].HolderBox != robot.ID() {
		t.Fatalf("the key's holder: %+v", ks)
	}
	// The box whose key another box uses comes back within its own
	// rejoin window, whatever its console advised: the key's session
	// resumes only within a few seconds.
	if tc := testenv.AgentOf(hub).Tunnel(); !tc.Hurry() {
		t.Fatal("the box offering its key to another is not in a hurry to come back after a break")
	}

	// The kernel project's client lists it once no client holds it.
	c.Close()
	t.Run("the usbip tool lists it", func(t *testing.T) {
		require.Tools(t, "usbip", "usbip")
		host, port, _ := net.SplitHostPort(keyServer)
		var out []byte
		testenv.WaitFor(t, 10*time.Second, "usbip list naming the key", func() bool {
			out, err = exec.Command("usbip", "--tcp-port", port, "list", "--remote", host).CombinedOutput()
			return (err == nil && strings.Contains(string(out), key.ID+":") && strings.Contains(string(out), "1050:0407")) || pause(100*time.Millisecond)
		})
		t.Logf("usbip list:\n%s", out)
	})

	// In use again: a read waits on the card, as a reader's slot-change
	// interrupt does; the release ends it, and the key is offered no more.
	testenv.WaitFor(t, 10*time.Second, "the key imported again", func() bool {
		c, err = usbip.Dial(ctx(t), keyServer, key.ID)
		return err == nil || pause(100*time.Millisecond)
	})
	defer c.Close()
	if _, err := ccidtest.Sign(ctx(t), c, 1, msg); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := c.Transfer(context.Background(), ccid.EndpointInterrupt, nil, 8)
		waiting <- err
	}()
	released := time.Now()
	if _, err := admin.Release(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, usbip.ErrClosed) {
			t.Fatalf("a transfer waiting when the lease ended: %v, want %v", err, usbip.ErrClosed)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a transfer waiting on the key did not end with the lease")
	}
	<-c.Done()
	if _, err := ccidtest.Sign(ctx(t), c, 2, msg); !errors.Is(err, usbip.ErrClosed) {
		t.Fatalf("a signature after the release: %v, want %v", err, usbip.ErrClosed)
	}
	t.Logf("the client lost the key %s after the release", time.Since(released).Round(10*time.Millisecond))
	if c2, err := usbip.Dial(ctx(t), keyServer, key.ID); err == nil {
		c2.Close()
		t.Fatal("the key was still offered on box B after the release")
	}

	// Box B's agent, whose loopback server offered a key, stops.
	stopped := make(chan struct{})
	go func() { robot.Stop(t); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("box B's agent did not stop within 30 s of being asked to, after offering a key on its loopback")
	}
}

// pause sleeps d and reports false: a poll's pace.
func pause(d time.Duration) bool {
	time.Sleep(d)
	return false
}

// TestARemoteKeyBetweenBinaries: the console and both agents as their
// binaries. A simulated key on box A (--usb-sim) is attached with the CLI
// (edgebox keys attach) to a native program on box B; B offers it on its
// loopback key server (--key-server), where a USB/IP client imports it
// and the card signs, through both tunnels and the console. keys ls shows
// where it is used from; the CLI's release takes it away.
func TestARemoteKeyBetweenBinaries(t *testing.T) {
	h := testenv.NewBinaries(t)
	sim := filepath.Join(t.TempDir(), "keys.json")
	cfg, _ := json.Marshal(usbhub.SimConfig{Hubs: []usbhub.SimHub{{Port: "1-1"}}, Keys: []usbhub.Device{{Port: "1-1.3",
		VendorID: "1050", ProductID: "0407", Serial: "UK-000789", Product: "bank UKEY", Class: usbhub.ClassSmartCard}}})
	if err := os.WriteFile(sim, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	hub, robot := enrollOne(t, h, "key-box"), enrollOne(t, h, "program-box")
	for d := robot.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o711) // its program runs as a user of its own
	}
	testenv.StartAgentArgs(t, hub, "--usb-sim", sim, "--key-server", "off")
	keyServer := testenv.FreeAddr(t)
	testenv.StartAgentArgs(t, robot, "--key-server", keyServer, "--workload-uids", "720000")

	admin := h.Admin()
	if _, err := admin.CreateApp(ctx(t), "signer", "a program signing with a bank's UKEY on another box"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateRelease(ctx(t), "signer", api.ReleaseSpec{Version: "1", Runtime: "process", Image: "/bin/sleep",
		Args: []string{"3600"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Deploy(ctx(t), "signer", "1", "box", robot.ID()); err != nil {
		t.Fatal(err)
	}
	var key api.Key
	testenv.WaitFor(t, 30*time.Second, "the key listed", func() bool {
		ks, err := admin.Keys(ctx(t), hub.ID(), nil)
		if err == nil && len(ks) == 1 {
			key = ks[0]
		}
		return key.ID != "" || pause(100*time.Millisecond)
	})
	out, err := h.CLI(t, "keys", "attach", key.ID, "--workload", "signer", "--box", "program-box")
	if err != nil || !strings.Contains(out, "leased to signer on box "+robot.ID()) {
		t.Fatalf("edgebox keys attach: %v\n%s", err, out)
	}
	var c *usbip.Client
	testenv.WaitFor(t, 60*time.Second, "the key offered on box B's loopback", func() bool {
		c, err = usbip.Dial(ctx(t), keyServer, key.ID)
		return err == nil || pause(200*time.Millisecond)
	})
	defer c.Close()
	msg := []byte("statement 2026-11, from a program on another box")
	if _, err := ccidtest.PowerOn(ctx(t), c, 1); err != nil {
		t.Fatal(err)
	}
	if err := ccidtest.Select(ctx(t), c, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := ccidtest.Sign(ctx(t), c, 3, msg); err != nil { // checked against the key
		t.Fatal(err)
	}
	if out, err := h.CLI(t, "keys", "ls"); err != nil || !strings.Contains(out, "signer@"+robot.ID()) {
		t.Fatalf("edgebox keys ls: %v\n%s", err, out)
	}
	if out, err := h.CLI(t, "keys", "release", key.ID); err != nil {
		t.Fatalf("edgebox keys release: %v\n%s", err, out)
	}
	select {
	case <-c.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the client kept the key after the release")
	}
	if out, err := h.CLI(t, "keys", "history", key.ID); err != nil || !strings.Contains(out, "remote-attach") || !strings.Contains(out, "remote-detach") {
		t.Fatalf("edgebox keys history: %v\n%s", err, out)
	}
}
