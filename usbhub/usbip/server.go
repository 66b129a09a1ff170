package usbip

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Limits a client is held to.
const (
	// opTimeout bounds how long a client takes to say what it wants.
	opTimeout = 10 * time.Second
	// writeTimeout bounds one reply to a client that does not read.
	writeTimeout = 30 * time.Second
	// maxInFlight bounds the URBs of one device being served at once; a
	// client past it is read no further until one ends.
	maxInFlight = 64
	// maxConns bounds the clients served at once.
	maxConns = 16
)

// Server offers devices over USB/IP. Its zero value is not usable: use
// New.
type Server struct {
	log *slog.Logger

	mu      sync.Mutex
	exports map[string]*export // by bus ID
	nextDev uint32
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// export is one device offered, and who has it.
type export struct {
	busID  string
	devnum uint32
	dev    usbdev.Device
	// release ends the connection that imported it; nil while free.
	release context.CancelFunc
}

// busnum is the bus every exported device is said to be on.
const busnum = 1

// New returns a server offering nothing yet.
func New(log *slog.Logger) *Server {
	return &Server{log: log.With("component", "usbip"), exports: map[string]*export{}, conns: map[net.Conn]struct{}{}}
}

// Add offers d as busID ("1-1" and the like: what `usbip attach -b`
// names).
func (s *Server) Add(busID string, d usbdev.Device) error {
	if busID == "" || len(busID) >= busIDSize {
		return fmt.Errorf("usbip: bus ID %q: 1 to %d characters", busID, busIDSize-1)
	}
	for _, c := range busID {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("usbip: bus ID %q: printable ASCII only", busID)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.exports[busID]; ok {
		return fmt.Errorf("usbip: bus ID %s is offered already", busID)
	}
	s.nextDev++
	s.exports[busID] = &export{busID: busID, devnum: s.nextDev, dev: d}
	return nil
}

// Remove stops offering busID, and ends the session of the client that
// imported it: to that client, the device is unplugged.
func (s *Server) Remove(busID string) {
	s.mu.Lock()
	e, ok := s.exports[busID]
	delete(s.exports, busID)
	s.mu.Unlock()
	if ok && e.release != nil {
		e.release()
	}
}

// Serve serves clients from ln until ln fails or Close; it returns nil
// after Close.
func (s *Server) Serve(ln net.Listener) error {
	sem := make(chan struct{}, maxConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		select {
		case sem <- struct{}{}:
		default:
			s.log.Warn("a USB/IP client was refused: too many at once", "remote", c.RemoteAddr(), "most", maxConns)
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			s.ServeConn(context.Background(), c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close ends every client's connection and waits for them; the caller
// closes the listener.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	for _, e := range s.exports {
		if e.release != nil {
			e.release()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// ServeConn serves one client until it leaves, it sends what the
// protocol does not allow, or ctx ends; it closes c.
func (s *Server) ServeConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(opTimeout))
	h, err := readOpHeader(c)
	if err != nil {
		return
	}
	if h.Version != Version {
		s.log.Info("a USB/IP client speaks another version", "remote", c.RemoteAddr(), "version", fmt.Sprintf("%#x", h.Version))
		return
	}
	switch h.Code {
	case opReqDevlist:
		s.devlist(c)
	case opReqImport:
		var b [busIDSize]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return
		}
		s.importDevice(ctx, c, cString(b[:]))
	default:
		s.log.Info("a USB/IP client asked for an unknown operation", "remote", c.RemoteAddr(), "code", fmt.Sprintf("%#x", h.Code))
	}
}

// devlist answers OP_REQ_DEVLIST with every device offered and free.
func (s *Server) devlist(c net.Conn) {
	s.mu.Lock()
	var free []*export
	for _, e := range s.exports {
		if e.release == nil {
			free = append(free, e)
		}
	}
	s.mu.Unlock()
	b := appendOpHeader(nil, opRepDevlist, stOK)
	b = binary.BigEndian.AppendUint32(b, uint32(len(free)))
	for _, e := range free {
		b = appendDevice(b, e.busID, busnum, e.devnum, e.dev.Info(), true)
	}
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	c.Write(b)
}

// importDevice answers OP_REQ_IMPORT and, when the device is free,
// serves its URBs until the client or the device goes.
func (s *Server) importDevice(ctx context.Context, c net.Conn, busID string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	e, ok := s.exports[busID]
	free := ok && e.release == nil
	if free {
		e.release = func() { cancel(); c.Close() }
	}
	s.mu.Unlock()
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if !free {
		s.log.Info("a USB/IP client asked for a device not offered, or in use", "remote", c.RemoteAddr(), "busid", busID, "offered", ok)
		c.Write(appendOpHeader(nil, opRepImport, stNA))
		return
	}
	defer func() {
		s.mu.Lock()
		if cur, ok := s.exports[busID]; ok && cur == e {
			e.release = nil
		}
		s.mu.Unlock()
	}()
	b := appendOpHeader(nil, opRepImport, stOK)
	if _, err := c.Write(appendDevice(b, e.busID, busnum, e.devnum, e.dev.Info(), false)); err != nil {
		return
	}
	s.log.Info("a USB/IP client imported a device", "remote", c.RemoteAddr(), "busid", busID)
	err := (&session{dev: e.dev, conn: c, inflight: map[uint32]context.CancelFunc{}, slots: make(chan struct{}, maxInFlight)}).run(ctx)
	s.log.Info("a USB/IP client let a device go", "remote", c.RemoteAddr(), "busid", busID, "why", err)
}

// session is one imported device's URBs.
type session struct {
	dev  usbdev.Device
	conn net.Conn

	mu       sync.Mutex // guards inflight and writes to conn
	inflight map[uint32]context.CancelFunc
	slots    chan struct{}
	wg       sync.WaitGroup
}

// run reads URBs until the client goes or sends what it may not; it
// returns why, once every URB it started has ended.
func (s *session) run(ctx context.Context) error {
	defer s.wg.Wait()
	defer s.cancelAll()
	s.conn.SetReadDeadline(time.Time{}) // a device may sit unused for hours
	stop := context.AfterFunc(ctx, func() { s.conn.Close() })
	defer stop()
	for {
		var hb [urbHeaderSize]byte
		if _, err := io.ReadFull(s.conn, hb[:]); err != nil {
			return err
		}
		u, err := parseURB(hb)
		if err != nil {
			return err
		}
		if u.command == cmdUnlink {
			s.unlink(u)
			continue
		}
		var out []byte
		if u.direction == dirOut && u.length > 0 {
			out = make([]byte, u.length)
			if _, err := io.ReadFull(s.conn, out); err != nil {
				return err
			}
		}
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
		if _, dup := s.inflight[u.seqnum]; dup {
			s.mu.Unlock()
			<-s.slots
			return fmt.Errorf("usbip: URB %d submitted twice", u.seqnum)
		}
		uctx, cancel := context.WithCancel(ctx)
		s.inflight[u.seqnum] = cancel
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.slots }()
			in, status := s.do(uctx, u, out)
			s.mu.Lock()
			defer s.mu.Unlock()
			if _, ok := s.inflight[u.seqnum]; !ok {
				return // unlinked: its RET_UNLINK said so, and nothing more is sent
			}
			delete(s.inflight, u.seqnum)
			cancel()
			s.write(appendRetSubmit(nil, u.seqnum, status, in, len(out), u.packets))
		}()
	}
}

// unlink cancels a URB in flight; the client hears that it was
// (-ECONNRESET), or that it had ended already (0).
func (s *session) unlink(u urb) {
	s.mu.Lock()
	defer s.mu.Unlock()
	status := int32(0)
	if cancel, ok := s.inflight[u.unlink]; ok {
		delete(s.inflight, u.unlink)
		cancel()
		status = -errnoECONNRESET
	}
	s.write(appendRetUnlink(nil, u.seqnum, status))
}

// write sends one reply; hold s.mu. A client that does not read has the
// connection closed on it.
func (s *session) write(b []byte) {
	s.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := s.conn.Write(b); err != nil {
		s.conn.Close()
	}
}

func (s *session) cancelAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for seq, cancel := range s.inflight {
		cancel()
		delete(s.inflight, seq)
	}
}

// do runs one URB on the device: its IN data, and its status as Linux
// has it (0, or a negated errno).
func (s *session) do(ctx context.Context, u urb, out []byte) ([]byte, int32) {
	var in []byte
	var err error
	switch {
	case u.ep == 0:
		setup := usbdev.ParseSetup(u.setup)
		if setup.In() {
			in, err = s.dev.Control(ctx, setup, nil)
		} else {
			_, err = s.dev.Control(ctx, setup, out)
		}
	case u.direction == dirIn:
		in, err = s.dev.Transfer(ctx, uint8(u.ep)|0x80, nil, int(u.length))
	default:
		_, err = s.dev.Transfer(ctx, uint8(u.ep), out, 0)
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
