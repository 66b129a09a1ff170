package usbip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Why a session ends, besides its connection's error.
var (
	errRemoved      = errors.New("usbip: the device is no longer offered")
	errServerClosed = errors.New("usbip: the server closed")
	errExpired      = errors.New("usbip: no resume within the window")
	errReleased     = errors.New("usbip: the client let the device go")
)

// violation is a client sending what the protocol does not allow: its
// session ends, resumable or not.
type violation struct{ error }

func (v violation) Unwrap() error { return v.error }

// session is one imported device's URBs. A standard import's session
// lives as long as its connection. A resumable one (resume.go) is held
// for the server's window once its connection drops, its URBs running on
// and their replies kept, and a resume carries it on over a new
// connection.
type session struct {
	srv       *Server
	e         *export
	resumable bool
	id        sessionID          // resumable only
	ctx       context.Context    // the session's life: its URBs run under it
	cancel    context.CancelFunc // ends ctx
	slots     chan struct{}      // one per URB running: at most maxInFlight
	wg        sync.WaitGroup     // URBs running
	done      chan struct{}      // closed once the session has ended, its URBs with it, and the device is free

	// attach is held while a connection takes the session over, so that
	// two do not at once.
	attach sync.Mutex
	// wmu is held from the choice of a reply to its write: replies are
	// kept in the order they are written.
	wmu sync.Mutex

	mu       sync.Mutex                    // guards what follows; never held during I/O
	cur      *attachment                   // the connection serving the session; nil between connections
	inflight map[uint32]context.CancelFunc // URBs running, by seqnum
	kept     []keptReply                   // resumable: the last RET_SUBMITs in the order written (or ended, between connections); at most maxInFlight
	last     uint32                        // resumable: the last seqnum read, once seen
	seen     bool
	expiry   *time.Timer // resumable, between connections: ends the session when it fires
	why      error       // why the session ended; nil until it has
}

// attachment is one connection serving a session.
type attachment struct {
	conn   net.Conn
	cancel context.CancelFunc // closes conn
	done   chan struct{}      // closed once its reader has stopped and it has let the session go
}

// keptReply is a RET_SUBMIT a resumable session keeps until a resume
// says whether it arrived.
type keptReply struct {
	seqnum uint32
	reply  []byte
}

func newSession(s *Server, e *export, id *sessionID) *session {
	ctx, cancel := context.WithCancel(context.Background())
	ss := &session{srv: s, e: e, ctx: ctx, cancel: cancel, slots: make(chan struct{}, maxInFlight),
		done: make(chan struct{}), inflight: map[uint32]context.CancelFunc{}}
	if id != nil {
		ss.resumable, ss.id = true, *id
	}
	return ss
}

// serve makes c the session's connection, taking it from the one before
// (which it closes, and waits for); sends hello's bytes, hello being
// called with ss.mu held; and reads URBs from c until c fails, ctx ends,
// or the session does. When the session has ended already it sends
// refusal instead.
func (ss *session) serve(ctx context.Context, c net.Conn, hello func() []byte, refusal []byte) {
	ss.attach.Lock()
	ss.mu.Lock()
	old := ss.cur
	ss.mu.Unlock()
	if old != nil {
		old.cancel()
		<-old.done
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(actx, func() { c.Close() })
	defer stop()
	a := &attachment{conn: c, cancel: cancel, done: make(chan struct{})}
	ss.wmu.Lock()
	ss.mu.Lock()
	if ss.why != nil {
		ss.mu.Unlock()
		ss.wmu.Unlock()
		ss.attach.Unlock()
		a.write(refusal)
		return
	}
	ss.cur = a
	if ss.expiry != nil {
		ss.expiry.Stop()
		ss.expiry = nil
	}
	b := hello()
	ss.mu.Unlock()
	ss.attach.Unlock()
	a.write(b)
	ss.wmu.Unlock()
	ss.detach(a, ss.read(actx, a))
}

// detach lets the session go from a, whose reader stopped for err: a
// standard session ends, and a resumable one is held for the window
// unless the client broke the protocol or let the device go.
func (ss *session) detach(a *attachment, err error) {
	a.cancel()
	ss.mu.Lock()
	if ss.cur == a {
		ss.cur = nil
		var v violation
		switch {
		case ss.why != nil:
		case !ss.resumable || errors.As(err, &v) || errors.Is(err, errReleased):
			ss.endLocked(err)
		default:
			ss.srv.log.Info("a USB/IP client's connection dropped; its session is held for a resume",
				"remote", a.conn.RemoteAddr(), "busid", ss.e.busID, "window", ss.srv.resumeWindow(), "err", err)
			var t *time.Timer
			t = time.AfterFunc(ss.srv.resumeWindow(), func() {
				ss.mu.Lock()
				defer ss.mu.Unlock()
				if ss.expiry == t {
					ss.endLocked(errExpired)
				}
			})
			ss.expiry = t
		}
	}
	ss.mu.Unlock()
	close(a.done)
}

// end ends the session: its connection closes, its URBs are cancelled,
// and once they have ended the device is free and done is closed. It is
// idempotent and does not wait.
func (ss *session) end(why error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.endLocked(why)
}

// endLocked is end with ss.mu held.
func (ss *session) endLocked(why error) {
	if ss.why != nil {
		return
	}
	if why == nil {
		why = io.EOF
	}
	ss.why = why
	ss.cancel()
	if ss.cur != nil {
		ss.cur.cancel()
	}
	if ss.expiry != nil {
		ss.expiry.Stop()
		ss.expiry = nil
	}
	for seq, cancel := range ss.inflight {
		cancel()
		delete(ss.inflight, seq)
	}
	ss.kept = nil
	go func() {
		ss.wg.Wait()
		ss.srv.forget(ss)
		ss.srv.log.Info("a USB/IP client let a device go", "busid", ss.e.busID, "resumable", ss.resumable, "why", why)
		close(ss.done)
	}()
}

// read reads URBs from a's connection until it fails or sends what it
// may not, or ctx ends; it returns why.
func (ss *session) read(ctx context.Context, a *attachment) error {
	c := a.conn
	c.SetReadDeadline(time.Time{}) // a device may sit unused for hours
	for {
		var hb [urbHeaderSize]byte
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return err
		}
		u, err := parseURB(hb)
		if err != nil {
			return violation{err}
		}
		switch u.command {
		case cmdRelease:
			if !ss.resumable {
				return violation{fmt.Errorf("usbip: command %#x is not a client's", u.command)}
			}
			return errReleased
		case cmdUnlink:
			if err := ss.unlink(a, u); err != nil {
				return err
			}
			continue
		}
		var out []byte
		if u.direction == dirOut && u.length > 0 {
			out = make([]byte, u.length)
			if _, err := io.ReadFull(c, out); err != nil {
				return err
			}
		}
		select {
		case ss.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := ss.start(u, out); err != nil {
			<-ss.slots
			return err
		}
	}
}

// start runs a URB read, holding a slot.
func (ss *session) start(u urb, out []byte) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.why != nil {
		return ss.why
	}
	if err := ss.order(u.seqnum); err != nil {
		return err
	}
	if _, dup := ss.inflight[u.seqnum]; dup {
		return violation{fmt.Errorf("usbip: URB %d submitted twice", u.seqnum)}
	}
	uctx, cancel := context.WithCancel(ss.ctx)
	ss.inflight[u.seqnum] = cancel
	ss.wg.Add(1)
	go ss.run(uctx, cancel, u, out)
	return nil
}

// order checks, in a resumable session, that seqnum comes after every
// one read before: so that no URB, submitted again after a resume, runs
// twice. Hold ss.mu.
func (ss *session) order(seqnum uint32) error {
	if !ss.resumable {
		return nil
	}
	if ss.seen && !after(seqnum, ss.last) {
		return violation{fmt.Errorf("usbip: URB %d after URB %d: a resumable session's seqnums increase", seqnum, ss.last)}
	}
	ss.last, ss.seen = seqnum, true
	return nil
}

// run runs one URB and sends its reply, or keeps it for a resume.
func (ss *session) run(ctx context.Context, cancel context.CancelFunc, u urb, out []byte) {
	defer ss.wg.Done()
	defer func() { <-ss.slots }()
	defer cancel()
	in, status := ss.do(ctx, u, out)
	reply := appendRetSubmit(nil, u.seqnum, status, in, len(out), u.packets)
	ss.wmu.Lock()
	defer ss.wmu.Unlock()
	ss.mu.Lock()
	if _, ok := ss.inflight[u.seqnum]; !ok {
		ss.mu.Unlock()
		return // unlinked: its RET_UNLINK said so, and nothing more is sent; or the session ended
	}
	delete(ss.inflight, u.seqnum)
	if ss.resumable {
		ss.keep(u.seqnum, reply)
	}
	a := ss.cur
	ss.mu.Unlock()
	if a != nil {
		a.write(reply)
	}
}

// keep keeps a RET_SUBMIT, forgetting the oldest past maxInFlight: a
// client has at most maxInFlight URBs unanswered, and TCP delivers in
// order, so the reply of any it still waits for is among those kept.
// Hold ss.mu.
func (ss *session) keep(seqnum uint32, reply []byte) {
	if len(ss.kept) == maxInFlight {
		copy(ss.kept, ss.kept[1:])
		ss.kept = ss.kept[:maxInFlight-1]
	}
	ss.kept = append(ss.kept, keptReply{seqnum: seqnum, reply: reply})
}

// unlink cancels a URB in flight; the client hears that it was
// (-ECONNRESET), or that it had ended already (0), after its
// RET_SUBMIT.
func (ss *session) unlink(a *attachment, u urb) error {
	ss.wmu.Lock()
	defer ss.wmu.Unlock()
	ss.mu.Lock()
	if err := ss.order(u.seqnum); err != nil {
		ss.mu.Unlock()
		return err
	}
	status := int32(0)
	if cancel, ok := ss.inflight[u.unlink]; ok {
		delete(ss.inflight, u.unlink)
		cancel()
		status = -errnoECONNRESET
	}
	ss.mu.Unlock()
	a.write(appendRetUnlink(nil, u.seqnum, status))
	return nil
}

// write sends bytes to the client; hold ss.wmu. A client that does not
// read has the connection closed on it.
func (a *attachment) write(b []byte) {
	a.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := a.conn.Write(b); err != nil {
		a.conn.Close()
	}
}

// do runs one URB on the device: its IN data, and its status as Linux
// has it (0, or a negated errno).
func (ss *session) do(ctx context.Context, u urb, out []byte) ([]byte, int32) {
	dev := ss.e.dev
	var in []byte
	var err error
	switch {
	case u.ep == 0:
		setup := usbdev.ParseSetup(u.setup)
		if setup.In() {
			in, err = dev.Control(ctx, setup, nil)
		} else {
			_, err = dev.Control(ctx, setup, out)
		}
	case u.direction == dirIn:
		in, err = dev.Transfer(ctx, uint8(u.ep)|0x80, nil, int(u.length))
	default:
		_, err = dev.Transfer(ctx, uint8(u.ep), out, 0)
	}
	switch {
	case errors.Is(err, usbdev.ErrStall):
		return []byte{}, -errnoEPIPE
	case err != nil:
		return []byte{}, -errnoENOENT
	}
	if u.direction == dirIn {
		if in == nil {
			in = []byte{}
		}
		if len(in) > int(u.length) {
			in = in[:u.length]
		}
		return in, 0
	}
	return nil, 0
}
