package usbip

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// patience bounds every wait of these tests: far more than any of them
// takes, so that only a real hang fails them.
const patience = 30 * time.Second

// links is a Dialer whose connections a test can cut, refuse for a
// while, or have lose what the server sends.
type links struct {
	addr string

	mu    sync.Mutex
	conns []*link
	down  bool // dials fail
	dials int
}

// link is one connection of links.
type link struct {
	net.Conn
	mu      sync.Mutex
	drop    bool // reads take what the server sent and lose it
	dropped int
}

func (l *link) Read(p []byte) (int, error) {
	for {
		n, err := l.Conn.Read(p)
		l.mu.Lock()
		drop := l.drop
		if drop {
			l.dropped += n
		}
		l.mu.Unlock()
		if !drop || err != nil {
			if drop {
				n = 0
			}
			return n, err
		}
	}
}

func (l *links) dial(ctx context.Context) (net.Conn, error) {
	l.mu.Lock()
	down := l.down
	l.mu.Unlock()
	if down {
		return nil, errors.New("the network is down")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", l.addr)
	if err != nil {
		return nil, err
	}
	lk := &link{Conn: c}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns = append(l.conns, lk)
	l.dials++
	return lk, nil
}

// cut closes every connection dialled, as a blip of the tunnel does.
func (l *links) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

func (l *links) setDown(down bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = down
}

// last is the connection dialled last.
func (l *links) last() *link {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[len(l.conns)-1]
}

// counted is a device that counts the reader commands it runs (bulk
// OUT, by the CCID message's sequence byte), holds them while hold is
// set, and says when an interrupt IN ends (cancelled).
type counted struct {
	usbdev.Device
	started chan byte     // each command held, as it starts
	ended   chan struct{} // each interrupt IN as it ends

	mu   sync.Mutex
	runs map[byte]int
	hold chan struct{} // commands wait for it to close
}

func newCounted() *counted {
	return &counted{Device: ccid.New(0x1050, 0x0407, "UK-000123"), started: make(chan byte, 64), ended: make(chan struct{}, 64), runs: map[byte]int{}}
}

func (d *counted) Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	switch {
	case ep == ccid.EndpointOut && len(data) >= 10:
		d.mu.Lock()
		d.runs[data[6]]++
		hold := d.hold
		d.mu.Unlock()
		if hold != nil {
			d.started <- data[6]
			select {
			case <-hold:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	case ep == ccid.EndpointInterrupt:
		defer func() { d.ended <- struct{}{} }()
	}
	return d.Device.Transfer(ctx, ep, data, length)
}

// holding makes commands wait until the function it returns is called.
func (d *counted) holding() (release func()) {
	ch := make(chan struct{})
	d.mu.Lock()
	d.hold = ch
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		d.hold = nil
		d.mu.Unlock()
		close(ch)
	}
}

func (d *counted) ran() map[byte]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[byte]int{}
	for k, v := range d.runs {
		m[k] = v
	}
	return m
}

// command sends a reader command and returns its answer, as a host's
// CCID driver does.
func command(ctx context.Context, dev usbdev.Device, typ, seq byte, body []byte) ([]byte, error) {
	m := []byte{typ}
	m = binary.LittleEndian.AppendUint32(m, uint32(len(body)))
	m = append(m, 0, seq, 0, 0, 0)
	if _, err := dev.Transfer(ctx, ccid.EndpointOut, append(m, body...), 0); err != nil {
		return nil, err
	}
	return answer(ctx, dev, seq)
}

// answer reads the answer to the reader command seq.
func answer(ctx context.Context, dev usbdev.Device, seq byte) ([]byte, error) {
	a, err := dev.Transfer(ctx, ccid.EndpointIn, nil, 1024)
	if err != nil {
		return nil, err
	}
	if len(a) < 10 || a[6] != seq {
		return nil, errors.New("the answer to another command: " + string(a))
	}
	return a, nil
}

// powerOn powers the card on as command seq, and checks its answer.
func powerOn(t *testing.T, dev usbdev.Device, seq byte) {
	t.Helper()
	a, err := command(t.Context(), dev, 0x62, seq, nil)
	if err != nil || a[0] != 0x80 || !bytes.Contains(a, []byte("edgeboxkey")) {
		t.Fatalf("power on %d: %x %v", seq, a, err)
	}
}

// waitFor polls cond until it holds, failing the test after patience.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(patience); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", patience, what)
		}
	}
}

// session of busID, and whether a connection serves it; nil when none.
func sessionOf(s *Server, busID string) (ss *session, attached bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for cur := range s.sessions {
		if cur.e.busID == busID {
			ss = cur
		}
	}
	if ss == nil {
		return nil, false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss, ss.cur != nil && ss.why == nil
}

// inflight counts the URBs running in 1-1's session.
func inflight(s *Server) int {
	ss, _ := sessionOf(s, "1-1")
	if ss == nil {
		return 0
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.inflight)
}

func held(s *Server) bool {
	ss, attached := sessionOf(s, "1-1")
	return ss != nil && !attached
}

func attached(s *Server) bool {
	_, a := sessionOf(s, "1-1")
	return a
}

func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("waited %v for %s", patience, what)
		panic("unreachable")
	}
}

func importResumable(t *testing.T, l *links, window time.Duration) *Remote {
	t.Helper()
	r, err := ImportResumable(t.Context(), l.dial, "1-1", window, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestAResumableImportSigns: a key imported resumably is the key: its
// descriptors, and its card signing what it is sent.
func TestAResumableImportSigns(t *testing.T) {
	t.Parallel()
	_, addr, _ := serve(t)
	r := importResumable(t, &links{addr: addr}, 10*time.Second)
	if i := r.Info(); i.Vendor != 0x1050 || i.Product != 0x0407 || i.Speed != usbdev.SpeedFull {
		t.Fatalf("info %+v", i)
	}
	d, err := r.Control(t.Context(), usbdev.Setup{RequestType: 0x80, Request: usbdev.RequestGetDescriptor, Value: usbdev.DescriptorDevice << 8, Length: 18}, nil)
	if err != nil || len(d) != 18 || binary.LittleEndian.Uint16(d[8:]) != 0x1050 {
		t.Fatalf("device descriptor %x %v", d, err)
	}
	if _, err := ImportResumable(t.Context(), (&links{addr: addr}).dial, "1-1", time.Second, quiet()); err == nil {
		t.Fatal("a key in use was imported twice")
	}
	powerOn(t, r, 1)
	apdu := func(seq byte, a []byte) []byte {
		t.Helper()
		res, err := command(t.Context(), r, 0x6F, seq, a)
		if err != nil || res[0] != 0x80 || res[7] != 0 {
			t.Fatalf("XfrBlock %x: %x %v", a, res, err)
		}
		return res[10:]
	}
	if res := apdu(2, append([]byte{0x00, 0xA4, 0x04, 0x00, byte(len(ccid.AID))}, ccid.AID...)); !bytes.Equal(res, []byte{0x90, 0x00}) {
		t.Fatalf("SELECT: %x", res)
	}
	pubRaw := apdu(3, []byte{0x00, 0xCA, 0x7F, 0x49, 0x00})
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), pubRaw[:len(pubRaw)-2])
	if err != nil || !pub.Equal(&ccid.TestKey().PublicKey) {
		t.Fatalf("GET DATA public key: %x %v", pubRaw, err)
	}
	msg := []byte("statement 2026-11 for account 6222 0000")
	sig := apdu(4, append(append([]byte{0x00, 0x2A, 0x9E, 0x9A, byte(len(msg))}, msg...), 0x00))
	digest := sha256.Sum256(msg)
	if !bytes.HasSuffix(sig, []byte{0x90, 0x00}) || !ecdsa.VerifyASN1(pub, digest[:], sig[:len(sig)-2]) {
		t.Fatalf("the signature does not verify: %x", sig)
	}
	// A read cancelled by its context is unlinked, and the session is in
	// step after it.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := r.Transfer(ctx, ccid.EndpointIn, nil, 64); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read with nothing to read: %v", err)
	}
	powerOn(t, r, 5)
	if r.Err() != nil {
		t.Fatalf("Err while the device is there: %v", r.Err())
	}
}

// TestAResumableImportSurvivesCuts: the connection is cut in the middle
// of transfers (their replies kept while no connection is there, sent
// on the new one, or sent and lost on the old one), between transfers,
// and for a while: each transfer completes once, and the key ran every
// command exactly once.
func TestAResumableImportSurvivesCuts(t *testing.T) {
	t.Parallel()
	dev := newCounted()
	s, addr := serveDevice(t, dev, 0)
	l := &links{addr: addr}
	r := importResumable(t, l, 10*time.Second)
	powerOn(t, r, 1)

	// cutDuring sends command seq while cutting as cut says, and returns
	// once it has completed.
	cutDuring := func(seq byte, cut func(release func())) {
		t.Helper()
		release := dev.holding()
		out := make(chan error, 1)
		go func() {
			m := []byte{0x62, 0, 0, 0, 0, 0, seq, 0, 0, 0}
			_, err := r.Transfer(t.Context(), ccid.EndpointOut, m, 0)
			out <- err
		}()
		if got := recv(t, "the command to start", dev.started); got != seq {
			t.Fatalf("command %d started, not %d", got, seq)
		}
		cut(release)
		if err := recv(t, "the command to complete", out); err != nil {
			t.Fatalf("command %d: %v", seq, err)
		}
		if _, err := answer(t.Context(), r, seq); err != nil {
			t.Fatalf("the answer to command %d: %v", seq, err)
		}
	}
	t.Run("its reply kept between connections", func(t *testing.T) {
		cutDuring(2, func(release func()) {
			l.setDown(true)
			l.cut()
			waitFor(t, "the session to be held", func() bool { return held(s) })
			release()
			l.setDown(false)
		})
	})
	t.Run("running across the resume", func(t *testing.T) {
		cutDuring(3, func(release func()) {
			l.mu.Lock()
			dials := l.dials
			l.mu.Unlock()
			l.cut()
			waitFor(t, "a resume", func() bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				return l.dials > dials && attached(s)
			})
			release()
		})
	})
	t.Run("its reply lost with the old connection", func(t *testing.T) {
		cutDuring(4, func(release func()) {
			lk := l.last()
			lk.mu.Lock()
			lk.drop = true
			lk.mu.Unlock()
			release()
			waitFor(t, "the reply to reach the client and be lost", func() bool {
				lk.mu.Lock()
				defer lk.mu.Unlock()
				return lk.dropped >= urbHeaderSize
			})
			l.cut()
		})
	})
	t.Run("a transfer whose context ends meanwhile", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		waiting := make(chan error, 1)
		go func() { _, err := r.Transfer(ctx, ccid.EndpointInterrupt, nil, 8); waiting <- err }()
		waitFor(t, "the read to reach the key", func() bool { return inflight(s) == 1 })
		l.setDown(true)
		l.cut()
		waitFor(t, "the session to be held", func() bool { return held(s) })
		cancel()
		if err := recv(t, "the read to end", waiting); !errors.Is(err, context.Canceled) {
			t.Fatalf("a read whose context ended: %v", err)
		}
		l.setDown(false)
		recv(t, "the server to cancel the read, on the resume", dev.ended)
	})
	t.Run("between transfers", func(t *testing.T) {
		l.cut()
		powerOn(t, r, 5)
		l.setDown(true)
		l.cut()
		go func() {
			time.Sleep(300 * time.Millisecond)
			l.setDown(false)
		}()
		powerOn(t, r, 6) // waits for the network
	})
	if n := inflight(s); n != 0 {
		t.Errorf("%d URBs left running", n)
	}
	for seq, n := range dev.ran() {
		if n != 1 {
			t.Errorf("command %d ran %d times", seq, n)
		}
	}
	if len(dev.ran()) != 6 {
		t.Errorf("commands run: %v", dev.ran())
	}
	if r.Err() != nil {
		t.Fatalf("the device went: %v", r.Err())
	}
}

// TestAResumableImportWhoseAnswerIsLost: the connection drops as the
// server answers the import; the client resumes the session the server
// took, rather than find the key in use.
func TestAResumableImportWhoseAnswerIsLost(t *testing.T) {
	t.Parallel()
	dev := newCounted()
	s, addr := serveDevice(t, dev, time.Hour)
	l := &links{addr: addr}
	first := true
	dial := func(ctx context.Context) (net.Conn, error) {
		c, err := l.dial(ctx)
		if err != nil || !first {
			return c, err
		}
		first = false
		lk := c.(*link)
		lk.mu.Lock()
		lk.drop = true
		lk.mu.Unlock()
		go func() {
			for {
				lk.mu.Lock()
				n := lk.dropped
				lk.mu.Unlock()
				if n >= opHeaderSize+deviceSize {
					lk.Close()
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
		return lk, nil
	}
	r, err := ImportResumable(t.Context(), dial, "1-1", time.Hour, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	powerOn(t, r, 1)
	l.mu.Lock()
	dials := l.dials
	l.mu.Unlock()
	if dials != 2 {
		t.Fatalf("%d dials, want the import's and the resume's", dials)
	}
	s.mu.Lock()
	n := len(s.sessions)
	s.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d sessions", n)
	}
}

// TestACutLongerThanTheWindow: the device is gone for the client
// (transfers end with ErrClosed, Done closes) and the server frees it.
func TestACutLongerThanTheWindow(t *testing.T) {
	t.Parallel()
	dev := newCounted()
	s, addr := serveDevice(t, dev, time.Second)
	l := &links{addr: addr}
	r := importResumable(t, l, time.Second)
	powerOn(t, r, 1)
	waiting := make(chan error, 1)
	go func() { _, err := r.Transfer(t.Context(), ccid.EndpointInterrupt, nil, 8); waiting <- err }()
	waitFor(t, "the read to reach the key", func() bool { return inflight(s) == 1 })
	l.setDown(true)
	l.cut()
	if err := recv(t, "the waiting read to end", waiting); !errors.Is(err, ErrClosed) {
		t.Fatalf("a read past the window: %v", err)
	}
	recv(t, "Done", r.Done())
	if r.Err() == nil || errors.Is(r.Err(), ErrClosed) {
		t.Fatalf("Err %v: it should say the window passed", r.Err())
	}
	if _, err := r.Transfer(t.Context(), ccid.EndpointIn, nil, 64); !errors.Is(err, ErrClosed) {
		t.Fatalf("a transfer after the end: %v", err)
	}
	recv(t, "the server to cancel the read", dev.ended)
	var err error
	waitFor(t, "the server to free the key", func() bool {
		var c *Client
		if c, err = Import(t.Context(), dialConn(t, addr), "1-1"); err == nil {
			c.Close()
		}
		return err == nil
	})
}

// TestTheServerEndsAHeldSession: Remove, or Close, ends a session held
// for a resume at once: its URBs are cancelled, and a resume is
// refused.
func TestTheServerEndsAHeldSession(t *testing.T) {
	t.Parallel()
	for name, end := range map[string]func(*Server){
		"remove": func(s *Server) { s.Remove("1-1") },
		"close":  func(s *Server) { s.Close() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dev := newCounted()
			s, addr := serveDevice(t, dev, time.Hour)
			l := &links{addr: addr}
			r := importResumable(t, l, time.Hour)
			powerOn(t, r, 1)
			go r.Transfer(t.Context(), ccid.EndpointInterrupt, nil, 8)
			waitFor(t, "the read to reach the key", func() bool { return inflight(s) == 1 })
			l.setDown(true)
			l.cut()
			waitFor(t, "the session to be held", func() bool { return held(s) })
			ended := make(chan struct{})
			go func() { end(s); close(ended) }()
			recv(t, "the server to cancel the read", dev.ended)
			recv(t, "the server to end the session", ended)
			waitFor(t, "the session to end", func() bool { ss, _ := sessionOf(s, "1-1"); return ss == nil })
			if name == "remove" {
				l.setDown(false)
				recv(t, "the client to hear its session ended", r.Done())
				if !errors.Is(r.Err(), errRefused) {
					t.Fatalf("Err %v, want a refusal", r.Err())
				}
			}
		})
	}
}

// TestResumesTheServerRefuses: a resume naming a session the server
// does not hold is refused, and the standard import still works.
func TestResumesTheServerRefuses(t *testing.T) {
	t.Parallel()
	_, addr, _ := serve(t)
	var id sessionID
	rand.Read(id[:])
	c := dial(t, addr)
	c.conn.Write(appendResumeRequest(nil, id, []uint32{1, 2}))
	if h, err := readOpHeader(c.conn); err != nil || h.Code != opRepResume || h.Status != stNoSession {
		t.Fatalf("a resume of a session never held: %+v %v", h, err)
	}
	// A session its client let go is no longer held.
	l := &links{addr: addr}
	r := importResumable(t, l, time.Hour)
	powerOn(t, r, 1)
	r.Close()
	c = dial(t, addr)
	c.conn.Write(appendResumeRequest(nil, r.id, nil))
	if h, err := readOpHeader(c.conn); err != nil || h.Status != stNoSession {
		t.Fatalf("a resume of a session let go: %+v %v", h, err)
	}
	// Freed at once: a plain client imports it.
	var st uint32 = 1
	waitFor(t, "the key to be free", func() bool { st, _ = dial(t, addr).importDevice("1-1"); return st == stOK })
}

// TestAResumeOnTheWire drives a resumable session as its client would,
// byte by byte: seqnums the server never read are submitted again, the
// reply it kept comes again, one it no longer has is lost (not run
// again), and a seqnum it read already is refused.
func TestAResumeOnTheWire(t *testing.T) {
	t.Parallel()
	dev := newCounted()
	s, addr := serveDevice(t, dev, time.Hour)
	var id sessionID
	rand.Read(id[:])
	c := dial(t, addr)
	c.conn.Write(append(appendFixed(appendOpHeader(nil, opReqImportResumable, 0), "1-1", busIDSize), id[:]...))
	if h, err := readOpHeader(c.conn); err != nil || h.Code != opRepImportResumable || h.Status != stOK {
		t.Fatalf("a resumable import: %+v %v", h, err)
	}
	io.ReadFull(c.conn, make([]byte, deviceSize))
	desc := usbdev.Setup{RequestType: 0x80, Request: usbdev.RequestGetDescriptor, Value: usbdev.DescriptorDevice << 8, Length: 18}
	for i := 1; i <= maxInFlight+6; i++ {
		if r := c.do(0, dirIn, desc, nil, 18); r.status != 0 || len(r.data) != 18 {
			t.Fatalf("URB %d: %+v", i, r)
		}
	}
	// Another client may not take the session over with the import.
	if st, _ := dial(t, addr).importDevice("1-1"); st != stNA {
		t.Fatalf("a key in a session was imported: %d", st)
	}
	// URB 70's reply, say, did not arrive; 71 and 72 were never sent.
	c = dial(t, addr)
	waiting := []uint32{1, 70, 71, 72}
	c.conn.Write(appendResumeRequest(nil, id, waiting))
	if h, err := readOpHeader(c.conn); err != nil || h.Code != opRepResume || h.Status != stOK {
		t.Fatalf("a resume: %+v %v", h, err)
	}
	io.ReadFull(c.conn, make([]byte, deviceSize))
	states, err := readResumeStates(c.conn, waiting)
	if err != nil || states[0] != resumeLost || states[1] != resumeAnswered || states[2] != resumeResubmit || states[3] != resumeResubmit {
		t.Fatalf("states %v %v", states, err)
	}
	if r := c.recv(map[uint32]bool{70: true}); r.command != retSubmit || r.seqnum != 70 || len(r.data) != 18 {
		t.Fatalf("the reply kept: %+v", r)
	}
	c.seq = 70
	if r := c.do(0, dirIn, desc, nil, 18); r.seqnum != 71 || r.status != 0 {
		t.Fatalf("URB 71 submitted again: %+v", r)
	}
	c.seq = 70 // 71 again: refused, and the session ends
	c.submit(1, dirOut, usbdev.Setup{}, []byte{0x62, 0, 0, 0, 0, 0, 9, 0, 0, 0}, 0)
	if _, err := io.ReadAll(c.conn); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Logf("read after a seqnum twice: %v", err)
	}
	waitFor(t, "the session to end", func() bool { ss, _ := sessionOf(s, "1-1"); return ss == nil })
	if n := dev.ran()[9]; n != 0 {
		t.Fatalf("a URB submitted with a seqnum read already ran (%d)", n)
	}
}
