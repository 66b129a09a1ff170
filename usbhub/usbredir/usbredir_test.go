package usbredir

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/vmtest"
	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbdev"
	"github.com/edgebox/edgebox/usbhub/usbip"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// guest is a test's usb-guest, speaking as QEMU's usb-redir does, with
// 64-bit ids once both hellos are through.
type guest struct {
	t     *testing.T
	c     net.Conn
	ids64 bool
}

func (g *guest) send(typ uint32, id uint64, body []byte) {
	b := binary.LittleEndian.AppendUint32(nil, typ)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
	if g.ids64 {
		b = binary.LittleEndian.AppendUint64(b, id)
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	if _, err := g.c.Write(append(b, body...)); err != nil {
		g.t.Fatal(err)
	}
}

func (g *guest) recv() (uint32, uint64, []byte) {
	g.t.Helper()
	n := 12
	if g.ids64 {
		n = 16
	}
	h := make([]byte, n)
	if _, err := io.ReadFull(g.c, h); err != nil {
		g.t.Fatal(err)
	}
	body := make([]byte, binary.LittleEndian.Uint32(h[4:]))
	if _, err := io.ReadFull(g.c, body); err != nil {
		g.t.Fatal(err)
	}
	var id uint64
	if g.ids64 {
		id = binary.LittleEndian.Uint64(h[8:])
	} else {
		id = uint64(binary.LittleEndian.Uint32(h[8:]))
	}
	return binary.LittleEndian.Uint32(h), id, body
}

// expect reads the next packet, which must be of type typ.
func (g *guest) expect(typ uint32) (uint64, []byte) {
	g.t.Helper()
	got, id, body := g.recv()
	if got != typ {
		g.t.Fatalf("packet type %d, want %d (%x)", got, typ, body)
	}
	return id, body
}

// TestAKeyThroughUSBRedir: a guest with QEMU's capabilities is told the
// simulated key's endpoints, interfaces and identity, then reads its
// descriptor, powers the card and has it sign; a bulk IN waiting for
// nothing is cancelled; the key's interrupt endpoint is polled on
// request.
func TestAKeyThroughUSBRedir(t *testing.T) {
	a, b := socketPair(t)
	b.SetDeadline(time.Now().Add(30 * time.Second))
	key := ccid.New(0x1050, 0x0407, "UK-000123")
	done := make(chan error, 1)
	go func() { done <- Serve(t.Context(), a, key, quiet()) }()

	g := &guest{t: t, c: b}
	hello := make([]byte, 64)
	copy(hello, "qemu test")
	caps := uint32(1<<capConnectDeviceVersion | 1<<capEpInfoMaxPacketSize | 1<<cap64BitIDs | 1<<cap32BitBulkLength | 1<<capDeviceDisconnectAck)
	g.send(typeHello, 0, binary.LittleEndian.AppendUint32(hello, caps))
	_, h := g.expect(typeHello)
	if !strings.HasPrefix(string(h), "edgebox usbredir") || binary.LittleEndian.Uint32(h[64:])&(1<<cap64BitIDs) == 0 {
		t.Fatalf("hello %q", h)
	}
	g.ids64 = true
	_, ep := g.expect(typeEpInfo)
	if len(ep) != 96+64 || ep[0] != 0 || ep[1] != 2 || ep[16+2] != 2 || ep[16+3] != 3 || ep[32+16+3] != 0x10 ||
		binary.LittleEndian.Uint16(ep[96+2*(16+3):]) != 8 || ep[5] != 255 {
		t.Fatalf("endpoints %x", ep)
	}
	_, ii := g.expect(typeInterfaceInfo)
	if binary.LittleEndian.Uint32(ii) != 1 || ii[4+32] != 0x0B {
		t.Fatalf("interfaces %x", ii)
	}
	_, dc := g.expect(typeDeviceConnect)
	if dc[0] != 1 || binary.LittleEndian.Uint16(dc[4:]) != 0x1050 || binary.LittleEndian.Uint16(dc[6:]) != 0x0407 || len(dc) != 10 {
		t.Fatalf("device connect %x", dc)
	}

	// GET_DESCRIPTOR (device), as a control packet.
	ctl := []byte{0, usbdev.RequestGetDescriptor, 0x80, 0, 0, usbdev.DescriptorDevice, 0, 0, 18, 0}
	g.send(typeControlPacket, 7, ctl)
	id, r := g.expect(typeControlPacket)
	if id != 7 || r[3] != statusSuccess || binary.LittleEndian.Uint16(r[8:]) != 18 || len(r) != 10+18 || binary.LittleEndian.Uint16(r[10+8:]) != 0x1050 {
		t.Fatalf("control answer %d %x", id, r)
	}

	// The reader's commands, through bulk packets.
	bulk := func(id uint64, ep uint8, out []byte, length int) []byte {
		t.Helper()
		hdr := []byte{ep, 0}
		if ep&0x80 == 0 {
			length = len(out)
		}
		hdr = binary.LittleEndian.AppendUint16(hdr, uint16(length))
		hdr = binary.LittleEndian.AppendUint32(hdr, 0)
		hdr = binary.LittleEndian.AppendUint16(hdr, uint16(length>>16))
		g.send(typeBulkPacket, id, append(hdr, out...))
		got, r := g.expect(typeBulkPacket)
		if got != id || r[1] != statusSuccess {
			t.Fatalf("bulk %d on %#x: %d %x", id, ep, got, r)
		}
		return r[10:]
	}
	command := func(id uint64, typ byte, body []byte) []byte {
		m := []byte{typ}
		m = binary.LittleEndian.AppendUint32(m, uint32(len(body)))
		bulk(id, ccid.EndpointOut, append(append(m, 0, byte(id), 0, 0, 0), body...), 0)
		return bulk(id+1, ccid.EndpointIn, nil, 1024)
	}
	if atr := command(10, 0x62, nil); atr[0] != 0x80 || !bytes.Contains(atr, []byte("edgeboxkey")) {
		t.Fatalf("power on: %x", atr)
	}
	if r := command(12, 0x6F, append([]byte{0, 0xA4, 4, 0, byte(len(ccid.AID))}, ccid.AID...)); !bytes.HasSuffix(r, []byte{0x90, 0}) {
		t.Fatalf("SELECT: %x", r)
	}
	msg := []byte("statement 2026-11")
	sig := command(14, 0x6F, append(append([]byte{0, 0x2A, 0x9E, 0x9A, byte(len(msg))}, msg...), 0))[10:]
	digest := sha256.Sum256(msg)
	if !ecdsa.VerifyASN1(&ccid.TestKey().PublicKey, digest[:], sig[:len(sig)-2]) {
		t.Fatalf("the signature does not verify: %x", sig)
	}

	// A bulk IN with nothing to read waits until the guest cancels it.
	hdr := binary.LittleEndian.AppendUint16([]byte{ccid.EndpointIn, 0}, 64)
	hdr = append(binary.LittleEndian.AppendUint32(hdr, 0), 0, 0)
	g.send(typeBulkPacket, 20, hdr)
	g.send(typeCancelDataPacket, 20, nil)
	if id, r := g.expect(typeBulkPacket); id != 20 || r[1] != statusCancelled {
		t.Fatalf("the cancelled bulk IN: %d %x", id, r)
	}
	// Interrupt receiving: on the interrupt endpoint, and not on another.
	g.send(typeStartInterruptReceiving, 21, []byte{ccid.EndpointInterrupt})
	if id, r := g.expect(typeInterruptReceivingStat); id != 21 || r[0] != statusSuccess {
		t.Fatalf("start receiving: %d %x", id, r)
	}
	g.send(typeStartInterruptReceiving, 22, []byte{ccid.EndpointIn})
	if id, r := g.expect(typeInterruptReceivingStat); id != 22 || r[0] != statusInval {
		t.Fatalf("receiving on a bulk endpoint: %d %x", id, r)
	}
	// A packet type a guest never sends ends the session.
	g.send(typeDeviceConnect, 0, make([]byte, 10))
	if err := <-done; err == nil || !strings.Contains(err.Error(), "not a guest's") {
		t.Fatalf("after a host's packet from the guest: %v", err)
	}
}

// TestQEMUTakesTheKey: QEMU's own usb-redir device, on an xHCI bus,
// takes the key this package offers: its monitor lists a full-speed
// device on the bus once the key is connected, and none before. The VM
// runs (its firmware finds nothing to boot): QEMU attaches a redirected
// device on the VM's clock.
func TestQEMUTakesTheKey(t *testing.T) {
	require.Tools(t, "qemu-system-x86", "qemu-system-x86_64")
	dir := t.TempDir()
	redir, qmp := filepath.Join(dir, "redir.sock"), filepath.Join(dir, "qmp.sock")
	cmd := exec.Command("qemu-system-x86_64", "-nodefaults", "-display", "none", "-machine", "pc", "-m", "64",
		"-device", "qemu-xhci,id=xhci",
		"-chardev", "socket,id=ur,path="+redir+",server=on,wait=off",
		"-device", "usb-redir,chardev=ur,id=key,bus=xhci.0",
		"-qmp", "unix:"+qmp+",server=on,wait=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	dial := func(path string) net.Conn {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			c, err := net.Dial("unix", path)
			if err == nil {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("QEMU's %s: %v; %s", filepath.Base(path), err, stderr.String())
			}
		}
	}
	mon := dial(qmp)
	defer mon.Close()
	mr := bufio.NewReader(mon)
	call := func(cmd string, args any) json.RawMessage {
		t.Helper()
		req, _ := json.Marshal(map[string]any{"execute": cmd, "arguments": args})
		mon.Write(append(req, '\n'))
		for {
			line, err := mr.ReadBytes('\n')
			if err != nil {
				t.Fatalf("QMP %s: %v; %s", cmd, err, stderr.String())
			}
			var r struct {
				Return json.RawMessage `json:"return"`
				Error  any             `json:"error"`
			}
			if json.Unmarshal(line, &r) == nil && (r.Return != nil || r.Error != nil) {
				if r.Error != nil {
					t.Fatalf("QMP %s: %v", cmd, r.Error)
				}
				return r.Return
			}
		}
	}
	mr.ReadBytes('\n') // the greeting
	call("qmp_capabilities", map[string]any{})
	usb := func() string {
		var s string
		json.Unmarshal(call("human-monitor-command", map[string]any{"command-line": "info usb"}), &s)
		return s
	}
	// QEMU lists its usb-redir device from the start, at low speed, as
	// nothing: full speed is the key's.
	if s := usb(); strings.Contains(s, "Speed 12 Mb/s") {
		t.Fatalf("a full-speed device on the bus before the key: %q", s)
	}

	c := dial(redir)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, c, ccid.New(0x1050, 0x0407, "UK-000123"), quiet()) }()
	t.Cleanup(func() { cancel(); c.Close(); <-done })
	var s string
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(s, "Speed 12 Mb/s"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("QEMU's USB bus never showed the key: %q; %s", s, stderr.String())
		}
		s = usb()
	}
	t.Logf("QEMU: %s", strings.TrimSpace(s))
}

// socketPair is two ends of a connection with the kernel's buffers
// between them, as a chardev socket has.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	b, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a := <-accepted
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// FuzzServe: whatever a guest sends after its hello ends the session
// with an error or is answered; nothing panics or hangs.
func FuzzServe(f *testing.F) {
	hello := binary.LittleEndian.AppendUint32(make([]byte, 64), 1<<cap64BitIDs|1<<cap32BitBulkLength|1<<capEpInfoMaxPacketSize)
	pkt := func(typ uint32, id uint64, body []byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, typ)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
		return append(binary.LittleEndian.AppendUint64(b, id), body...)
	}
	f.Add(pkt(typeControlPacket, 1, []byte{0, 6, 0x80, 0, 0, 1, 0, 0, 18, 0}))
	f.Add(pkt(typeBulkPacket, 2, []byte{1, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0x62, 0, 0, 0, 0, 0, 1, 0, 0, 0}))
	f.Add(pkt(typeSetConfiguration, 3, []byte{1}))
	f.Add(pkt(typeStartInterruptReceiving, 4, []byte{0x83}))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := socketPair(t)
		go io.Copy(io.Discard, b)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, a, ccid.New(1, 2, "x"), quiet()) }()
		h := binary.LittleEndian.AppendUint32(nil, typeHello)
		h = binary.LittleEndian.AppendUint32(h, uint32(len(hello)))
		b.Write(append(append(binary.LittleEndian.AppendUint32(h, 0), hello...), in...))
		time.Sleep(time.Millisecond)
		b.Close()
		a.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the host did not let go of a guest that left")
		}
	})
}

// TestAGuestSeesTheKeyAndItSigns: a real guest (Debian's generic kernel
// under TCG, its xHCI driver) on QEMU's usb-redir device sees the key on
// its bus with its vendor, product and serial, and a static program in
// it has the card sign through usbfs; the signature verifies against
// the key on this side. Once with the key here, once with the key
// served over USB/IP and imported, as a key on another box is.
func TestAGuestSeesTheKeyAndItSigns(t *testing.T) {
	vmtest.RequireUSB(t)
	t.Run("here", func(t *testing.T) { guestSigns(t, ccid.New(0x1050, 0x0407, "UK-000123")) })
	t.Run("over USB/IP", func(t *testing.T) {
		srv := usbip.New(quiet())
		if err := srv.Add("1-1", ccid.New(0x1050, 0x0407, "UK-000123")); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
		defer func() { srv.Close(); ln.Close() }()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		key, err := usbip.Import(t.Context(), conn, "1-1")
		if err != nil {
			t.Fatal(err)
		}
		defer key.Close()
		guestSigns(t, key)
	})
}

// guestSigns boots the USB guest with key on its bus and checks what it
// saw and had signed.
func guestSigns(t *testing.T, key usbdev.Device) {
	dir := t.TempDir()
	files := vmtest.USBFiles(t, dir, vmtest.GuestProgram(t, "usbhub/usbredir/testdata/apdu"))
	redir, serial := filepath.Join(dir, "redir.sock"), filepath.Join(dir, "serial.log")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", "-nodefaults", "-display", "none", "-machine", "pc", "-m", "256",
		"-no-reboot", "-kernel", files.Kernel, "-initrd", files.Initrd, "-append", "console=ttyS0 panic=-1 quiet",
		"-serial", "file:"+serial,
		"-device", "qemu-xhci,id=xhci",
		"-chardev", "socket,id=ur,path="+redir+",server=on,wait=off",
		"-device", "usb-redir,chardev=ur,bus=xhci.0")
	var stderr bytes.Buffer
	qemu.Stderr = &stderr
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	var c net.Conn
	var err error
	for deadline := time.Now().Add(20 * time.Second); c == nil; time.Sleep(50 * time.Millisecond) {
		if c, err = net.Dial("unix", redir); err != nil && time.Now().After(deadline) {
			t.Fatalf("QEMU's usb-redir socket: %v; %s", err, stderr.String())
		}
	}
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, c, key, quiet()) }()
	waitErr := qemu.Wait() // the guest powers off when done
	c.Close()
	<-served
	out, _ := os.ReadFile(serial)
	if waitErr != nil {
		t.Fatalf("QEMU: %v; %s\nguest:\n%s", waitErr, stderr.String(), out)
	}
	var sigHex string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, vmtest.USBLine); ok && v != "GUEST DONE" && !strings.HasPrefix(v, "1050:0407 UK-000123 /dev/bus/usb/") {
			t.Fatalf("the guest saw %q", line)
		}
		if v, ok := strings.CutPrefix(line, "APDU SIGNED "); ok {
			sigHex = v
		}
	}
	if !strings.Contains(string(out), "USB 1050:0407 UK-000123") || sigHex == "" {
		t.Fatalf("the guest printed:\n%s", out)
	}
	sig, err := hex.DecodeString(sigHex)
	digest := sha256.Sum256([]byte("statement 2026-11, signed in the guest"))
	if err != nil || !ecdsa.VerifyASN1(&ccid.TestKey().PublicKey, digest[:], sig) {
		t.Fatalf("the guest's signature %q does not verify: %v", sigHex, err)
	}
	t.Logf("the guest:\n%s", out)
}
