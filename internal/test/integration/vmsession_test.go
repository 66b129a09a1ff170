//go:build linux

package integration

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/vmtest"
)

// TestVMSerialAndScreenThroughTheConsole: a real QEMU guest deployed on a
// box answers a command on its serial console through a remote session,
// and its screen comes through the console as RFB: the handshake, and a
// full framebuffer update with pixels painted; the same view only.
func TestVMSerialAndScreenThroughTheConsole(t *testing.T) {
	vmtest.Require(t)
	h := testenv.NewInProcess(t, testenv.Options{})
	d := vmtest.Driver(t)
	box := enrollOne(t, h, "vm-host")
	testenv.StartAgent(t, box, func(c *agent.Config) { c.Drivers = []runtime.Driver{d}; c.Reconcile = time.Second })
	deployGuest(t, h, box, nil)
	admin := h.Admin()
	testenv.WaitFor(t, 120*time.Second, "the VM booted", func() bool {
		l, err := admin.Logs(ctx(t), box.ID(), "guest", 50)
		return err == nil && strings.Contains(l.Text, vmtest.Up)
	})

	// The serial console.
	s, err := admin.OpenSession(ctx(t), box.ID(), api.SessionOptions{Workload: "guest", TTY: true, Cols: 80, Rows: 24})
	if err != nil {
		t.Fatal(err)
	}
	var seen bytes.Buffer
	deadline := time.Now().Add(30 * time.Second)
	until := func(want string) {
		for !strings.Contains(seen.String(), want) {
			f, err := s.Recv()
			if err != nil || time.Now().After(deadline) {
				t.Fatalf("the guest's serial console: %v; %q", err, seen.String())
			}
			if f.Type == api.FrameOutput {
				seen.Write(f.Payload)
			}
		}
	}
	until("# ") // its shell's prompt: typing before it may be lost
	s.Write([]byte("echo serial-$((40+2))\n"))
	until("serial-42")
	s.Close()

	// The screen, interactive and view only.
	for _, viewOnly := range []bool{false, true} {
		conn, err := admin.OpenScreen(ctx(t), box.ID(), "guest", viewOnly, "")
		if err != nil {
			t.Fatal(err)
		}
		w, hgt, painted := rfbFrame(t, conn, viewOnly)
		conn.Close()
		if w == 0 || hgt == 0 || painted == 0 {
			t.Fatalf("view only %v: a %dx%d screen with %d painted pixels", viewOnly, w, hgt, painted)
		}
		t.Logf("view only %v: a %dx%d screen, %d pixels painted", viewOnly, w, hgt, painted)
	}
	// On a four-eyes box a screen asks first; a second maintainer
	// approves; then its user opens it, once.
	if _, err := admin.SetSessionRules(ctx(t), api.SessionRules{FourEyes: []api.BoxMatch{{Region: "east"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.OpenScreen(ctx(t), box.ID(), "guest", true, ""); !api.NeedsApproval(err) {
		t.Fatalf("a screen on a four-eyes box without approval: %v", err)
	}
	asked, err := admin.AskSession(ctx(t), box.ID(), "screen", "guest", "", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.OpenScreen(ctx(t), box.ID(), "guest", true, asked.ID); err == nil {
		t.Fatal("a screen opened before its approval")
	}
	if err := admin.ApproveSession(ctx(t), asked.ID); err == nil {
		t.Fatal("approved by the user who asked")
	}
	if _, err := admin.CreateUser(ctx(t), api.UserRequest{Name: "bob", Password: "a long enough password", Role: "maintainer"}); err != nil {
		t.Fatal(err)
	}
	bobLogin, err := api.NewClient(h.URL(), "", h.CAPEM())
	if err != nil {
		t.Fatal(err)
	}
	me, err := bobLogin.Login(ctx(t), "bob", "a long enough password", "test", "1h")
	if err != nil {
		t.Fatal(err)
	}
	bob, _ := api.NewClient(h.URL(), me.Token, h.CAPEM())
	if err := bob.ApproveSession(ctx(t), asked.ID); err != nil {
		t.Fatal(err)
	}
	conn, err := admin.OpenScreen(ctx(t), box.ID(), "guest", true, asked.ID)
	if err != nil {
		t.Fatal(err)
	}
	if w, _, painted := rfbFrame(t, conn, true); w == 0 || painted == 0 {
		t.Fatal("the approved screen showed nothing")
	}
	conn.Close()
	if _, err := admin.OpenScreen(ctx(t), box.ID(), "guest", true, asked.ID); err == nil {
		t.Fatal("an approval opened a second screen")
	}
	testenv.WaitFor(t, 10*time.Second, "the approved screen's record", func() bool {
		r, err := admin.Session(ctx(t), asked.ID)
		return err == nil && !r.Live() && r.ApprovedBy == "bob" && r.Kind == "screen" && r.BytesOut > 0
	})
	testenv.WaitFor(t, 10*time.Second, "the screens' records", func() bool {
		ss, _ := admin.Sessions(ctx(t), false, "")
		n := 0
		for _, r := range ss {
			if r.Kind == "screen" && !r.Live() && r.BytesOut > 0 {
				n++
			}
		}
		return n == 3
	})
}

// rfbFrame speaks RFB 3.8 as a viewer: the handshake with no security,
// then one full framebuffer update in raw encoding. It returns the
// screen's size and how many of its pixels are not black.
func rfbFrame(t *testing.T, c net.Conn, sendKey bool) (int, int, int) {
	t.Helper()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	read := func(n int) []byte {
		b := make([]byte, n)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("RFB: %v", err)
		}
		return b
	}
	if v := read(12); string(v) != "RFB 003.008\n" {
		t.Fatalf("the VM speaks %q", v)
	}
	c.Write([]byte("RFB 003.008\n"))
	n := int(read(1)[0])
	types := read(n)
	if !bytes.Contains(types, []byte{1}) {
		t.Fatalf("no None security among %v", types)
	}
	c.Write([]byte{1})
	if r := binary.BigEndian.Uint32(read(4)); r != 0 {
		t.Fatalf("security result %d", r)
	}
	c.Write([]byte{1}) // shared
	init := read(24)
	w, hgt := int(binary.BigEndian.Uint16(init[0:])), int(binary.BigEndian.Uint16(init[2:]))
	read(int(binary.BigEndian.Uint32(init[20:])))
	// 32 bits a pixel, raw encoding only.
	pf := []byte{0, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}
	c.Write(pf)
	c.Write([]byte{2, 0, 0, 1, 0, 0, 0, 0})
	if sendKey { // dropped by a view-only screen; harmless to the guest either way
		c.Write([]byte{4, 1, 0, 0, 0, 0, 0, 'x'})
	}
	req := []byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(req[6:], uint16(w))
	binary.BigEndian.PutUint16(req[8:], uint16(hgt))
	c.Write(req)
	painted := 0
	for {
		hdr := read(1)
		switch hdr[0] {
		case 0: // FramebufferUpdate
			rest := read(3)
			rects := int(binary.BigEndian.Uint16(rest[1:]))
			for range rects {
				rh := read(12)
				rw, rhh := int(binary.BigEndian.Uint16(rh[4:])), int(binary.BigEndian.Uint16(rh[6:]))
				enc := int32(binary.BigEndian.Uint32(rh[8:]))
				if enc != 0 {
					continue // a pseudo-encoding the server sends unasked: no pixels
				}
				px := read(rw * rhh * 4)
				// Lit pixels in the screen's top eighth: the guest's own
				// boot text (QEMU's "no display" notice sits mid-screen).
				for i := 0; i < len(px) && i < rw*4*(rhh/8); i += 4 {
					if px[i]|px[i+1]|px[i+2] != 0 {
						painted++
					}
				}
			}
			return w, hgt, painted
		case 2: // Bell
		case 3: // ServerCutText
			read(3)
			read(int(binary.BigEndian.Uint32(read(4))))
		default:
			t.Fatalf("server message %d", hdr[0])
		}
	}
}
