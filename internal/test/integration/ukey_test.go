//go:build linux

package integration

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/images/vm"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
	"github.com/edgebox/edgebox/internal/test/vmtest"
	"github.com/edgebox/edgebox/usbhub"
	"github.com/edgebox/edgebox/usbhub/ccid"
)

// signedLine is what the guest's program prints for each signature the
// key's card made: "APDU <n> SIGNED <hex>".
var signedLine = regexp.MustCompile(`APDU (\d+) SIGNED ([0-9a-f]+)`)

// TestARemoteKeyInAVM: the console and two agents as their binaries. A
// simulated key on box A (--usb-sim), leased to a VM workload on box B,
// reaches the guest through both tunnels and the console: the guest sees
// its vendor, product and serial on its own USB bus, and a program in it
// has the card sign each second; the signatures verify. Box B reaches the
// console only through a proxy whose every tunnel goes through toxiproxy:
// at 80 ms of round trip the key still signs; a 5 s cut is no unplug (the
// signing goes on, and the guest never sees the key go); a 60 s cut is
// one, and the key is plugged in again once the link is back. Releasing
// the lease takes the key from the guest at once. The key's history names
// both boxes.
func TestARemoteKeyInAVM(t *testing.T) {
	vmtest.RequireUSB(t)
	h := testenv.NewBinaries(t)
	sim := filepath.Join(t.TempDir(), "keys.json")
	keys, _ := json.Marshal(usbhub.SimConfig{Hubs: []usbhub.SimHub{{Port: "1-1"}}, Keys: []usbhub.Device{{Port: "1-1.2",
		VendorID: "1050", ProductID: "0407", Serial: "UK-000123", Product: "bank UKEY", Class: usbhub.ClassSmartCard}}})
	if err := os.WriteFile(sim, keys, 0o644); err != nil {
		t.Fatal(err)
	}
	hub, robot := enrollOne(t, h, "hub-box"), enrollOne(t, h, "robot-box")
	noContainerd := filepath.Join(t.TempDir(), "no-containerd.sock")
	testenv.StartAgentArgs(t, hub, "--usb-sim", sim, "--key-server", "off", "--containerd", noContainerd)
	link := toxic.New(t, strings.TrimPrefix(h.URL(), "https://"))
	out := toxic.NewConnectProxyVia(t, "robot", "s3cret", link.Addr())
	vms := filepath.Join(robot.DataDir(), "qemu")
	vmtest.RemoveVMsAtEnd(t, vms) // after the agent stops
	testenv.StartAgentArgs(t, robot, "--proxy", "http://robot:s3cret@"+out.Addr, "--vm-accel", "tcg",
		"--key-server", "off", "--containerd", noContainerd, "--workload-uids", "730000")
	deployUSBGuest(t, h, robot)
	guest := vmLog{path: filepath.Join(vms, "vms", "robot", "serial.log")}
	guest.waitFor(t, 180*time.Second, "the guest watching its USB bus", func(s string) bool { return strings.Contains(s, vmtest.USBWatching) })

	admin := h.Admin()
	var key api.Key
	testenv.WaitFor(t, 20*time.Second, "the key listed", func() bool {
		ks, err := admin.Keys(ctx(t), hub.ID(), nil)
		if err == nil && len(ks) == 1 {
			key = ks[0]
		}
		return key.ID != ""
	})
	if _, err := admin.Attach(ctx(t), key.ID, "robot", robot.ID()); err != nil {
		t.Fatal(err)
	}
	guest.waitFor(t, 60*time.Second, "the guest seeing the key and signing", func(s string) bool {
		return strings.Contains(s, vmtest.USBLine+"1050:0407 UK-000123 /dev/bus/usb/") && signatures(t, s) >= 2
	})
	if ks, _ := admin.Keys(ctx(t), hub.ID(), nil); len(ks) != 1 || ks[0].Holder != "robot" || ks[0].HolderBox != robot.ID() {
		t.Fatalf("the key's holder: %+v", ks)
	}

	// 80 ms of round trip on the holder's link.
	for _, stream := range []string{"upstream", "downstream"} {
		if err := link.Add("latency-"+stream, "latency", stream, `"latency": 40`); err != nil {
			t.Fatal(err)
		}
	}
	n := signatures(t, guest.text(t))
	guest.waitFor(t, 30*time.Second, "signatures at 80 ms", func(s string) bool { return signatures(t, s) >= n+3 })
	for _, stream := range []string{"upstream", "downstream"} {
		link.Remove("latency-" + stream)
	}

	// A 5 s cut: every connection of the holder's box dropped, and none
	// taken, for 5 s. The key stays in the guest, and it signs again.
	gone := strings.Count(guest.text(t), vmtest.USBGoneLine)
	n = signatures(t, guest.text(t))
	link.Cut()
	time.Sleep(5 * time.Second)
	if err := link.Heal(); err != nil {
		t.Fatal(err)
	}
	guest.waitFor(t, 60*time.Second, "signatures after a 5 s cut", func(s string) bool { return signatures(t, s) >= n+3 })
	if g := strings.Count(guest.text(t), vmtest.USBGoneLine); g != gone {
		t.Fatalf("the guest saw the key go in a 5 s cut:\n%s", guest.text(t))
	}

	// A 60 s cut: the key goes from the guest, and comes back once the
	// link does.
	plugs := strings.Count(guest.text(t), vmtest.USBLine+"1050:0407")
	cut := time.Now()
	link.Cut()
	guest.waitFor(t, 45*time.Second, "the key gone in a long cut", func(s string) bool { return strings.Count(s, vmtest.USBGoneLine) > gone })
	t.Logf("the guest saw the key go %s into the cut", time.Since(cut).Round(time.Second))
	time.Sleep(time.Until(cut.Add(60 * time.Second)))
	if err := link.Heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	n = signatures(t, guest.text(t))
	guest.waitFor(t, 90*time.Second, "the key back after the cut, signing", func(s string) bool {
		return strings.Count(s, vmtest.USBLine+"1050:0407") > plugs && signatures(t, s) > n
	})
	t.Logf("the key was back in the guest %s after the link", time.Since(healed).Round(time.Second))

	// The release takes it from the guest.
	gone = strings.Count(guest.text(t), vmtest.USBGoneLine)
	released := time.Now()
	if _, err := admin.Release(ctx(t), key.ID); err != nil {
		t.Fatal(err)
	}
	guest.waitFor(t, 30*time.Second, "the key gone after the release", func(s string) bool { return strings.Count(s, vmtest.USBGoneLine) > gone })
	t.Logf("the guest saw the key go %s after the release", time.Since(released).Round(100*time.Millisecond))

	hist, err := admin.KeyHistory(ctx(t), key.ID)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, e := range hist.Events {
		events = append(events, e.Event+" "+e.Workload+" "+e.Detail)
	}
	all := strings.Join(events, "\n")
	for _, want := range []string{"lease robot on box " + robot.ID(), "remote-attach robot on box " + robot.ID() + " from box " + hub.ID(),
		"remote-detach", "release robot on box " + robot.ID()} {
		if !strings.Contains(all, want) {
			t.Errorf("the key's history has no %q:\n%s", want, all)
		}
	}
}

// signatures counts the guest's signatures in s, checking each against
// the simulated key's public key.
func signatures(t *testing.T, s string) int {
	t.Helper()
	digest := sha256.Sum256([]byte("statement 2026-11, signed in the guest"))
	ms := signedLine.FindAllStringSubmatch(s, -1)
	for _, m := range ms {
		sig, err := hex.DecodeString(m[2])
		if err != nil || !ecdsa.VerifyASN1(&ccid.TestKey().PublicKey, digest[:], sig) {
			t.Fatalf("the guest's signature %d (%s) does not verify: %v", len(ms), m[2], err)
		}
	}
	return len(ms)
}

// deployUSBGuest pushes the USB watching guest, whose program signs with
// the key each second, as app robot's release 1, and deploys it to box.
func deployUSBGuest(t *testing.T, h testenv.Harness, box testenv.Box) {
	t.Helper()
	program := vmtest.GuestProgram(t, "usbhub/usbredir/testdata/apdu")
	ref, _ := name.ParseReference(testenv.RegistryHost(h) + "/robots/usb-guest:1")
	if _, err := vm.Push(ref, vmtest.USBWatchFiles(t, t.TempDir(), program), vm.Config{Cmdline: vmtest.Cmdline + " APDU_EVERY=1s"},
		remote.WithTransport(testenv.RegistryTransport(h)), remote.WithAuth(&authn.Basic{Username: "x", Password: h.AdminToken()})); err != nil {
		t.Fatal(err)
	}
	admin := h.Admin()
	if _, err := admin.CreateApp(ctx(t), "robot", "a robot in a VM, with a bank's UKEY"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateRelease(ctx(t), "robot", api.ReleaseSpec{Version: "1", Runtime: "qemu",
		Image: "robots/usb-guest:1", MemoryBytes: 256 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Deploy(ctx(t), "robot", "1", "box", box.ID()); err != nil {
		t.Fatal(err)
	}
}

// vmLog reads a VM's serial console on the box itself, which works while
// the box's link is cut.
type vmLog struct{ path string }

// text is the guest's serial log up to its last whole line: QEMU may be
// writing the next one as it is read, and half a signature does not verify.
func (l vmLog) text(*testing.T) string {
	b, _ := os.ReadFile(l.path)
	return string(b[:bytes.LastIndexByte(b, '\n')+1])
}

func (l vmLog) waitFor(t *testing.T, within time.Duration, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond(l.text(t)) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; the guest:\n%s", what, l.text(t))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
