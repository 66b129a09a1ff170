package usbip

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbdev"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// serve starts a server offering one simulated key as 1-1 on loopback.
func serve(t *testing.T) (*Server, string, *ccid.Key) {
	t.Helper()
	key := ccid.New(0x1050, 0x0407, "UK-000123")
	s, addr := serveDevice(t, key, 0)
	return s, addr, key
}

// serveDevice starts a server offering dev as 1-1 on loopback, holding
// resumable sessions for window (0: the default).
func serveDevice(t *testing.T, dev usbdev.Device, window time.Duration) (*Server, string) {
	t.Helper()
	s := New(quiet())
	s.ResumeWindow = window
	if err := s.Add("1-1", dev); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

// client is a test's USB/IP client, as the kernel's vhci-hcd speaks it.
type client struct {
	t    *testing.T
	conn net.Conn
	seq  uint32
	mu   sync.Mutex
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return &client{t: t, conn: c}
}

func (c *client) importDevice(busID string) (status uint32, dev []byte) {
	c.t.Helper()
	b := appendOpHeader(nil, opReqImport, 0)
	c.conn.Write(appendFixed(b, busID, busIDSize))
	h, err := readOpHeader(c.conn)
	if err != nil {
		c.t.Fatal(err)
	}
	if h.Code != opRepImport {
		c.t.Fatalf("import answered with code %#x", h.Code)
	}
	if h.Status != stOK {
		return h.Status, nil
	}
	dev = make([]byte, deviceSize)
	if _, err := io.ReadFull(c.conn, dev); err != nil {
		c.t.Fatal(err)
	}
	return 0, dev
}

// submit sends a CMD_SUBMIT and returns its seqnum.
func (c *client) submit(ep, dir uint32, setup usbdev.Setup, out []byte, length int) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	b := binary.BigEndian.AppendUint32(nil, cmdSubmit)
	b = binary.BigEndian.AppendUint32(b, c.seq)
	b = binary.BigEndian.AppendUint32(b, busnum<<16|1)
	b = binary.BigEndian.AppendUint32(b, dir)
	b = binary.BigEndian.AppendUint32(b, ep)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	if dir == dirOut {
		length = len(out)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(length))
	b = append(b, 0, 0, 0, 0)             // start_frame
	b = append(b, 0xff, 0xff, 0xff, 0xff) // number_of_packets: not isochronous
	b = append(b, 0, 0, 0, 0)             // interval
	sb := setup.Bytes()
	b = append(b, sb[:]...)
	c.conn.Write(append(b, out...))
	return c.seq
}

func (c *client) unlink(seq uint32) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	b := binary.BigEndian.AppendUint32(nil, cmdUnlink)
	b = binary.BigEndian.AppendUint32(b, c.seq)
	b = append(b, make([]byte, 12)...)
	b = binary.BigEndian.AppendUint32(b, seq)
	c.conn.Write(append(b, make([]byte, 24)...))
	return c.seq
}

// ret is a RET_SUBMIT or RET_UNLINK.
type ret struct {
	command, seqnum uint32
	status          int32
	data            []byte
}

// recv reads the next reply; IN data comes with a RET_SUBMIT whose
// request was IN, which the caller says.
func (c *client) recv(in map[uint32]bool) ret {
	c.t.Helper()
	var h [urbHeaderSize]byte
	if _, err := io.ReadFull(c.conn, h[:]); err != nil {
		c.t.Fatal(err)
	}
	r := ret{command: be32(h[0:]), seqnum: be32(h[4:]), status: int32(be32(h[20:]))}
	if r.command == retSubmit && in[r.seqnum] {
		r.data = make([]byte, be32(h[24:]))
		if _, err := io.ReadFull(c.conn, r.data); err != nil {
			c.t.Fatal(err)
		}
	}
	return r
}

// do runs one transfer and waits for its answer.
func (c *client) do(ep, dir uint32, setup usbdev.Setup, out []byte, length int) ret {
	c.t.Helper()
	seq := c.submit(ep, dir, setup, out, length)
	r := c.recv(map[uint32]bool{seq: dir == dirIn})
	if r.command != retSubmit || r.seqnum != seq {
		c.t.Fatalf("answer %+v to URB %d", r, seq)
	}
	return r
}

// ccidCommand sends a reader command on bulk OUT and reads its answer
// on bulk IN, as a host's CCID driver does (64-byte reads until a short
// one).
func (c *client) ccidCommand(typ byte, seq byte, body []byte) []byte {
	c.t.Helper()
	m := []byte{typ}
	m = binary.LittleEndian.AppendUint32(m, uint32(len(body)))
	m = append(m, 0, seq, 0, 0, 0)
	if r := c.do(1, dirOut, usbdev.Setup{}, append(m, body...), 0); r.status != 0 {
		c.t.Fatalf("bulk OUT: status %d", r.status)
	}
	var answer []byte
	for {
		r := c.do(2, dirIn, usbdev.Setup{}, nil, 64)
		if r.status != 0 {
			c.t.Fatalf("bulk IN: status %d", r.status)
		}
		answer = append(answer, r.data...)
		if len(r.data) < 64 {
			return answer
		}
	}
}

// TestAKeyOverUSBIP imports a simulated key and drives it as a host
// would: its descriptors, its configuration, then the reader powering
// the card and an APDU exchange whose signature checks against the
// key's public key. A second client cannot take the key meanwhile.
func TestAKeyOverUSBIP(t *testing.T) {
	_, addr, _ := serve(t)
	c := dial(t, addr)
	status, dev := c.importDevice("1-1")
	if status != 0 || cString(dev[256:288]) != "1-1" || binary.BigEndian.Uint16(dev[300:]) != 0x1050 || binary.BigEndian.Uint16(dev[302:]) != 0x0407 {
		t.Fatalf("import: status %d, device %q %x", status, cString(dev[256:288]), dev[300:304])
	}
	if st, _ := dial(t, addr).importDevice("1-1"); st != stNA {
		t.Fatalf("a second client imported a key in use: status %d", st)
	}
	if st, _ := dial(t, addr).importDevice("9-9"); st != stNA {
		t.Fatalf("a key not offered was imported: status %d", st)
	}

	getDesc := func(typ, index uint8, length uint16) ret {
		return c.do(0, dirIn, usbdev.Setup{RequestType: 0x80, Request: usbdev.RequestGetDescriptor, Value: uint16(typ)<<8 | uint16(index), Length: length}, nil, int(length))
	}
	d := getDesc(usbdev.DescriptorDevice, 0, 18)
	if d.status != 0 || len(d.data) != 18 || binary.LittleEndian.Uint16(d.data[8:]) != 0x1050 {
		t.Fatalf("device descriptor: %+v", d)
	}
	cfg := getDesc(usbdev.DescriptorConfiguration, 0, 9)
	total := binary.LittleEndian.Uint16(cfg.data[2:])
	cfg = getDesc(usbdev.DescriptorConfiguration, 0, total)
	if len(cfg.data) != int(total) || cfg.data[9+5] != 0x0B {
		t.Fatalf("configuration: %x", cfg.data)
	}
	serial := getDesc(usbdev.DescriptorString, 3, 255)
	if string(bytes.ReplaceAll(serial.data[2:], []byte{0}, nil)) != "UK-000123" {
		t.Fatalf("serial string: %q", serial.data)
	}
	if r := getDesc(usbdev.DescriptorString, 9, 255); r.status != -errnoEPIPE {
		t.Fatalf("a string the key does not have: status %d, want a stall", r.status)
	}
	if r := c.do(0, dirOut, usbdev.Setup{Request: usbdev.RequestSetConfiguration, Value: 1}, nil, 0); r.status != 0 {
		t.Fatalf("set configuration: %d", r.status)
	}

	// An interrupt IN waits for a slot change; unlinking it ends it.
	waiting := c.submit(3, dirIn, usbdev.Setup{}, nil, 8)
	unl := c.unlink(waiting)
	if r := c.recv(nil); r.command != retUnlink || r.seqnum != unl || r.status != -errnoECONNRESET {
		t.Fatalf("unlink of a waiting URB: %+v", r)
	}

	atr := c.ccidCommand(0x62, 1, nil)
	if atr[0] != 0x80 || atr[7] != 0 || !bytes.Contains(atr[10:], []byte("edgeboxkey")) {
		t.Fatalf("power on: %x", atr)
	}
	apdu := func(seq byte, a []byte) []byte {
		r := c.ccidCommand(0x6F, seq, a)
		if r[0] != 0x80 || r[7] != 0 {
			t.Fatalf("XfrBlock %x: %x", a, r)
		}
		return r[10:]
	}
	if r := apdu(2, append([]byte{0x00, 0x2A, 0x9E, 0x9A, 3}, "abc"...)); !bytes.Equal(r, []byte{0x69, 0x85}) {
		t.Fatalf("a signature before SELECT: %x", r)
	}
	if r := apdu(3, append([]byte{0x00, 0xA4, 0x04, 0x00, byte(len(ccid.AID))}, ccid.AID...)); !bytes.Equal(r, []byte{0x90, 0x00}) {
		t.Fatalf("SELECT: %x", r)
	}
	if r := apdu(4, []byte{0x00, 0xCA, 0x00, 0x5A, 0x00}); string(r) != "UK-000123\x90\x00" {
		t.Fatalf("GET DATA serial: %q", r)
	}
	pubRaw := apdu(5, []byte{0x00, 0xCA, 0x7F, 0x49, 0x00})
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), pubRaw[:len(pubRaw)-2])
	if err != nil || !pub.Equal(&ccid.TestKey().PublicKey) {
		t.Fatalf("GET DATA public key: %x %v", pubRaw, err)
	}
	msg := []byte("statement 2026-11 for account 6222 0000")
	sig := apdu(6, append(append([]byte{0x00, 0x2A, 0x9E, 0x9A, byte(len(msg))}, msg...), 0x00))
	digest := sha256.Sum256(msg)
	if !bytes.HasSuffix(sig, []byte{0x90, 0x00}) || !ecdsa.VerifyASN1(pub, digest[:], sig[:len(sig)-2]) {
		t.Fatalf("the signature does not verify: %x", sig)
	}
	if r := apdu(7, []byte{0x80, 0xCA, 0x00, 0x5A}); !bytes.Equal(r, []byte{0x6E, 0x00}) {
		t.Fatalf("another class: %x", r)
	}
}

// TestTheUsbipToolListsTheKey: the kernel project's own client lists
// what the server offers, with the key's IDs and bus ID.
func TestTheUsbipToolListsTheKey(t *testing.T) {
	require.Tools(t, "usbip", "usbip")
	_, addr, _ := serve(t)
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("usbip", "--tcp-port", port, "list", "--remote", host).CombinedOutput()
	if err != nil {
		t.Fatalf("usbip list: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "1-1:") || !strings.Contains(string(out), "1050:0407") {
		t.Fatalf("usbip list:\n%s", out)
	}
	t.Logf("usbip list:\n%s", out)
}

// TestBadClientsHarmNothing: a client that sends garbage, stalls, or
// asks for an absurd transfer is let go, and the key is still served to
// the next.
func TestBadClientsHarmNothing(t *testing.T) {
	_, addr, _ := serve(t)
	for name, msg := range map[string][]byte{
		"another version":  {0x01, 0x00, 0x80, 0x05, 0, 0, 0, 0},
		"unknown op":       appendOpHeader(nil, 0x8999, 0),
		"truncated import": appendOpHeader(nil, opReqImport, 0)[:6],
	} {
		c := dial(t, addr)
		c.conn.Write(msg)
		c.conn.(*net.TCPConn).CloseWrite()
		if b, _ := io.ReadAll(c.conn); len(b) != 0 && !strings.HasPrefix(name, "unknown") {
			t.Errorf("%s: answered %x", name, b)
		}
	}
	// An import, then a transfer of 100 MB: the connection is closed.
	c := dial(t, addr)
	if st, _ := c.importDevice("1-1"); st != 0 {
		t.Fatal(st)
	}
	b := binary.BigEndian.AppendUint32(nil, cmdSubmit)
	b = append(b, make([]byte, 16)...)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, 100<<20)
	c.conn.Write(append(b, make([]byte, 20)...))
	if _, err := io.ReadAll(c.conn); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Logf("read after an absurd transfer: %v", err)
	}
	// The key is free again for the next client.
	var st uint32 = 1
	for deadline := time.Now().Add(10 * time.Second); st != 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		st, _ = dial(t, addr).importDevice("1-1")
	}
	if st != 0 {
		t.Fatalf("the key was not free after a bad client: %d", st)
	}
}

// TestRemoveUnplugs: a key no longer offered ends the session of the
// client that had it.
func TestRemoveUnplugs(t *testing.T) {
	s, addr, _ := serve(t)
	c := dial(t, addr)
	if st, _ := c.importDevice("1-1"); st != 0 {
		t.Fatal(st)
	}
	c.submit(3, dirIn, usbdev.Setup{}, nil, 8) // waits
	s.Remove("1-1")
	if _, err := c.conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection lived on after its key was removed")
	}
	if st, _ := dial(t, addr).importDevice("1-1"); st != stNA {
		t.Fatalf("a removed key was imported: %d", st)
	}
}

func TestBusIDs(t *testing.T) {
	s := New(quiet())
	for _, id := range []string{"", strings.Repeat("1", 32), "1 1", "1-\x00"} {
		if s.Add(id, ccid.New(1, 2, "x")) == nil {
			t.Errorf("bus ID %q was taken", id)
		}
	}
	if err := s.Add("1-2", ccid.New(1, 2, "x")); err != nil {
		t.Fatal(err)
	}
	if s.Add("1-2", ccid.New(1, 2, "y")) == nil {
		t.Error("a bus ID taken twice")
	}
}

// FuzzServeConn: any bytes from a client end its connection or are
// answered; none panics or hangs the server.
func FuzzServeConn(f *testing.F) {
	imp := appendFixed(appendOpHeader(nil, opReqImport, 0), "1-1", busIDSize)
	sub := binary.BigEndian.AppendUint32(nil, cmdSubmit)
	sub = append(sub, make([]byte, 8)...)
	sub = binary.BigEndian.AppendUint32(sub, dirIn)
	sub = binary.BigEndian.AppendUint32(sub, 0)
	sub = append(sub, make([]byte, 4)...)
	sub = binary.BigEndian.AppendUint32(sub, 18)
	sub = append(sub, make([]byte, 12)...)
	setup := usbdev.Setup{RequestType: 0x80, Request: 6, Value: 0x100, Length: 18}.Bytes()
	sub = append(sub, setup[:]...)
	f.Add(appendOpHeader(nil, opReqDevlist, 0))
	f.Add(append(append([]byte{}, imp...), sub...))
	f.Add(append(append([]byte{}, imp...), []byte{0, 0, 0, 2, 0, 0, 0, 9}...))
	f.Add(append(appendFixed(appendOpHeader(nil, opReqImportResumable, 0), "1-1", busIDSize), make([]byte, sessionIDSize)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		s := New(quiet())
		defer s.Close() // and a session held for a resume
		s.Add("1-1", ccid.New(1, 2, "x"))
		a, b := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			s.ServeConn(ctx, a)
		}()
		go io.Copy(io.Discard, b)
		b.Write(in)
		b.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the server did not let go of a client that left")
		}
	})
}

// TestAClientDrivesTheKey: a key imported with Client works as the key
// itself does: descriptors, the reader's commands, a read cancelled by
// its context (unlinked) with the connection still in step after it;
// the server's side ending ends the client's transfers.
func TestAClientDrivesTheKey(t *testing.T) {
	s, addr, _ := serve(t)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Import(t.Context(), conn, "1-1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if i := c.Info(); i.Vendor != 0x1050 || i.Product != 0x0407 || i.Speed != usbdev.SpeedFull {
		t.Fatalf("info %+v", i)
	}
	if _, err := Import(t.Context(), dialConn(t, addr), "1-1"); err == nil {
		t.Fatal("a key in use was imported twice")
	}
	d, err := c.Control(t.Context(), usbdev.Setup{RequestType: 0x80, Request: usbdev.RequestGetDescriptor, Value: usbdev.DescriptorDevice << 8, Length: 18}, nil)
	if err != nil || len(d) != 18 || binary.LittleEndian.Uint16(d[8:]) != 0x1050 {
		t.Fatalf("device descriptor %x %v", d, err)
	}
	if _, err := c.Control(t.Context(), usbdev.Setup{RequestType: 0x80, Request: usbdev.RequestGetDescriptor, Value: usbdev.DescriptorString<<8 | 9, Length: 255}, nil); !errors.Is(err, usbdev.ErrStall) {
		t.Fatalf("a string the key has not: %v, want a stall", err)
	}
	// Nothing to read yet: the read is unlinked when its context ends.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	if _, err := c.Transfer(ctx, ccid.EndpointIn, nil, 64); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read with nothing to read: %v", err)
	}
	cancel()
	for seq := byte(1); seq <= 20; seq++ { // in step after the unlink, and many times over
		m := []byte{0x62, 0, 0, 0, 0, 0, seq, 0, 0, 0}
		if _, err := c.Transfer(t.Context(), ccid.EndpointOut, m, 0); err != nil {
			t.Fatal(err)
		}
		a, err := c.Transfer(t.Context(), ccid.EndpointIn, nil, 1024)
		if err != nil || a[0] != 0x80 || a[6] != seq || !bytes.Contains(a, []byte("edgeboxkey")) {
			t.Fatalf("power on %d: %x %v", seq, a, err)
		}
	}
	// The key removed: a read waiting on it ends, and so does the client.
	waiting := make(chan error, 1)
	go func() { _, err := c.Transfer(t.Context(), ccid.EndpointInterrupt, nil, 8); waiting <- err }()
	time.Sleep(50 * time.Millisecond)
	s.Remove("1-1")
	if err := <-waiting; !errors.Is(err, ErrClosed) {
		t.Fatalf("a read when the key went: %v", err)
	}
	<-c.Done()
	if _, err := c.Transfer(t.Context(), ccid.EndpointIn, nil, 64); !errors.Is(err, ErrClosed) {
		t.Fatalf("a transfer after the end: %v", err)
	}
}

func dialConn(t *testing.T, addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// FuzzClient: whatever a server sends after a good import, a client's
// transfers end (with an answer, an error, or their context) and nothing
// panics.
func FuzzClient(f *testing.F) {
	ret := binary.BigEndian.AppendUint32(nil, retSubmit)
	ret = binary.BigEndian.AppendUint32(ret, 1)
	ret = append(ret, make([]byte, 12)...)
	ret = binary.BigEndian.AppendUint32(ret, 0)
	ret = binary.BigEndian.AppendUint32(ret, 4)
	f.Add(append(append(ret, make([]byte, 20)...), 1, 2, 3, 4))
	f.Add(append(binary.BigEndian.AppendUint32(nil, retUnlink), make([]byte, 44)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		defer b.Close()
		go func() {
			io.ReadFull(b, make([]byte, opHeaderSize+busIDSize))
			reply := appendOpHeader(nil, opRepImport, stOK)
			b.Write(appendDevice(reply, "1-1", busnum, 1, usbdev.Info{Vendor: 1, Product: 2}, false))
			go io.Copy(io.Discard, b)
			b.Write(in)
		}()
		c, err := Import(context.Background(), a, "1-1")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		c.Transfer(ctx, 0x82, nil, 64)
		c.Close()
	})
}
