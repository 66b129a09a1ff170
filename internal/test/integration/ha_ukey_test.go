//go:build linux

package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/ccidtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
	"github.com/edgebox/edgebox/usbhub"
	"github.com/edgebox/edgebox/usbhub/usbip"
)

// TestARemoteKeyAcrossReplicas: two console replicas as binaries behind
// HAProxy, and two boxes whose tunnels land on different replicas (each
// reaches the console through a proxy that sends every tunnel to one
// replica, its name and certificate unchanged). A simulated key on box A,
// held by replica 1, is leased to a program on box B, held by replica 0:
// B's usbip stream reaches replica 0, whose broker reaches the key through
// replica 1. A USB/IP client on B's loopback imports the key, and the card
// signs; releasing the lease takes it away, and the key's history names
// both boxes.
func TestARemoteKeyAcrossReplicas(t *testing.T) {
	t.Parallel()
	ha := startReplicas(t, 2)
	sim := filepath.Join(t.TempDir(), "keys.json")
	cfg, _ := json.Marshal(usbhub.SimConfig{Hubs: []usbhub.SimHub{{Port: "1-1"}}, Keys: []usbhub.Device{{Port: "1-1.4",
		VendorID: "1050", ProductID: "0407", Serial: "UK-000321", Product: "bank UKEY", Class: usbhub.ClassSmartCard}}})
	if err := os.WriteFile(sim, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := ha.admin.CreateToken(ctx(t), api.TokenRequest{Region: "east", Site: "ha", Uses: 2})
	if err != nil {
		t.Fatal(err)
	}
	hub, err := testenv.EnrollBinary(t, tok.Text, "key-box")
	if err != nil {
		t.Fatal(err)
	}
	robot, err := testenv.EnrollBinary(t, tok.Text, "program-box")
	if err != nil {
		t.Fatal(err)
	}
	openToWorkloads(robot.DataDir()) // its program runs as a user of its own
	// Each box reaches one replica only.
	toKeys := toxic.NewConnectProxyVia(t, "hub", "s3cret", ha.reps[1].addr)
	toRobot := toxic.NewConnectProxyVia(t, "robot", "s3cret", ha.reps[0].addr)
	testenv.StartAgentArgs(t, hub, "--proxy", "http://hub:s3cret@"+toKeys.Addr, "--usb-sim", sim, "--key-server", "off")
	keyServer := testenv.FreeAddr(t)
	testenv.StartAgentArgs(t, robot, "--proxy", "http://robot:s3cret@"+toRobot.Addr, "--key-server", keyServer, "--workload-uids", "740000")

	want := map[string]string{hub.ID(): ha.reps[1].id(t), robot.ID(): ha.reps[0].id(t)}
	testenv.WaitFor(t, 60*time.Second, "each box online, held by its replica", func() bool {
		held, ok := holders(t, ha.admin, 2)
		return ok && held[hub.ID()] == want[hub.ID()] && held[robot.ID()] == want[robot.ID()] || pause(200*time.Millisecond)
	})

	admin := ha.admin
	if _, err := admin.CreateApp(ctx(t), "signer", "a program signing with a bank's UKEY on a box another replica holds"); err != nil {
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
	if _, err := admin.Attach(ctx(t), key.ID, "signer", robot.ID()); err != nil {
		t.Fatal(err)
	}

	var c *usbip.Client
	testenv.WaitFor(t, 60*time.Second, "the key offered on box B's loopback", func() bool {
		c, err = usbip.Dial(ctx(t), keyServer, key.ID)
		return err == nil || pause(200*time.Millisecond)
	})
	defer c.Close()
	if i := c.Info(); i.Vendor != 0x1050 || i.Product != 0x0407 {
		t.Fatalf("the key offered on box B: %+v", i)
	}
	if atr, err := ccidtest.PowerOn(ctx(t), c, 1); err != nil || !strings.Contains(string(atr), "edgeboxkey") {
		t.Fatalf("power on: %x %v", atr, err)
	}
	if err := ccidtest.Select(ctx(t), c, 2); err != nil {
		t.Fatal(err)
	}
	if serial, err := ccidtest.APDU(ctx(t), c, 3, []byte{0x00, 0xCA, 0x00, 0x5A, 0x00}); err != nil || string(serial) != "UK-000321\x90\x00" {
		t.Fatalf("GET DATA serial: %q %v", serial, err)
	}
	msg := []byte("statement 2026-11, signed on box B with a key on box A, each on its own console replica")
	if _, err := ccidtest.Sign(ctx(t), c, 4, msg); err != nil { // checked against the key
		t.Fatal(err)
	}

	if _, err := admin.Release(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the client kept the key after the release")
	}
	var events []string
	testenv.WaitFor(t, 20*time.Second, "the key's history to name the attach and the detach", func() bool {
		h, err := admin.KeyHistory(ctx(t), key.ID)
		events = events[:0]
		attached, detached := false, false
		for _, e := range h.Events {
			events = append(events, e.Event+" "+e.Detail)
			attached = attached || e.Event == "remote-attach" && strings.Contains(e.Detail, hub.ID()) && strings.Contains(e.Detail, robot.ID())
			detached = detached || e.Event == "remote-detach"
		}
		return err == nil && attached && detached || pause(200*time.Millisecond)
	})
	t.Logf("the key's history: %q", events)
}
