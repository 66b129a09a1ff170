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
	// maxConns bounds the clients served at once: a hub's worth of keys,
	// each with its own.
	maxConns = 128
)

// Server offers devices over USB/IP. Its zero value is not usable: use
// New.
type Server struct {
	// ResumeWindow is how long a resumable session (resume.go) is held
	// once its connection drops, for a resume; zero means
	// DefaultResumeWindow. Set it before Serve or ServeConn, and not
	// after.
	ResumeWindow time.Duration

	log *slog.Logger

	mu       sync.Mutex         // guards what follows
	exports  map[string]*export // by bus ID
	nextDev  uint32
	conns    map[net.Conn]struct{}
	sessions map[*session]struct{}  // every session not yet ended and done
	byID     map[sessionID]*session // the resumable ones
	closed   bool
	wg       sync.WaitGroup // Serve's connections
}

// export is one device offered, and who has it.
type export struct {
	busID  string
	devnum uint32
	dev    usbdev.Device
	// release ends the session that imported it; nil while free.
	release func()
}

// DefaultResumeWindow is how long a server holds a resumable session
// whose connection dropped: a blip of the tunnel between two boxes lasts
// up to 10 s.
const DefaultResumeWindow = 10 * time.Second

// resumeWindow is ResumeWindow, or its default.
func (s *Server) resumeWindow() time.Duration {
	if s.ResumeWindow > 0 {
		return s.ResumeWindow
	}
	return DefaultResumeWindow
}

// busnum is the bus every exported device is said to be on.
const busnum = 1

// New returns a server offering nothing yet.
func New(log *slog.Logger) *Server {
	return &Server{log: log.With("component", "usbip"), exports: map[string]*export{}, conns: map[net.Conn]struct{}{},
		sessions: map[*session]struct{}{}, byID: map[sessionID]*session{}}
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
// imported it, held for a resume or not: to that client, the device is
// unplugged. It does not wait for the session's URBs to end.
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

// Close ends every client's connection and session, held ones too, and
// waits for them and their URBs; the caller closes the listener. It is
// idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	var sessions []*session
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	for _, ss := range sessions {
		ss.end(errServerClosed)
	}
	s.wg.Wait()
	for _, ss := range sessions {
		<-ss.done
	}
	return nil
}

// ServeConn serves one client until it leaves, it sends what the
// protocol does not allow, or ctx ends; it closes c. A resumable session
// (resume.go) outlives it, held for a resume.
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
	case opReqImportResumable:
		var b [busIDSize + sessionIDSize]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return
		}
		s.importResumable(ctx, c, cString(b[:busIDSize]), sessionID(b[busIDSize:]))
	case opReqResume:
		id, waiting, err := readResumeRequest(c)
		if err != nil {
			s.log.Info("a USB/IP client asked for a resume the protocol does not allow", "remote", c.RemoteAddr(), "err", err)
			return
		}
		s.resume(ctx, c, id, waiting)
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
	ss, _, why := s.take(busID, nil)
	if ss == nil {
		s.log.Info("a USB/IP client asked for a device not offered, or in use", "remote", c.RemoteAddr(), "busid", busID, "why", why)
		c.SetWriteDeadline(time.Now().Add(writeTimeout))
		c.Write(appendOpHeader(nil, opRepImport, stNA))
		return
	}
	s.log.Info("a USB/IP client imported a device", "remote", c.RemoteAddr(), "busid", busID)
	reply := appendDevice(appendOpHeader(nil, opRepImport, stOK), ss.e.busID, busnum, ss.e.devnum, ss.e.dev.Info(), false)
	ss.serve(ctx, c, func() []byte { return reply }, appendOpHeader(nil, opRepImport, stNA))
	<-ss.done
}

// take starts a session on busID, resumable under id when id is not nil.
// When the device is not offered or in use, the server is closed, or id
// names a session already, it returns nil, the status to answer, and
// why.
func (s *Server) take(busID string, id *sessionID) (*session, uint32, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.exports[busID]
	switch {
	case s.closed:
		return nil, stNA, "the server is closing"
	case !ok:
		return nil, stNA, "not offered"
	case e.release != nil:
		return nil, stNA, "in use"
	case id != nil && s.byID[*id] != nil:
		return nil, stError, "the session ID is taken"
	}
	ss := newSession(s, e, id)
	e.release = func() { ss.end(errRemoved) }
	s.sessions[ss] = struct{}{}
	if id != nil {
		s.byID[*id] = ss
	}
	return ss, stOK, ""
}

// forget frees an ended session's device, once its URBs have ended.
func (s *Server) forget(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.exports[ss.e.busID]; ok && cur == ss.e {
		ss.e.release = nil
	}
	delete(s.sessions, ss)
	if ss.resumable && s.byID[ss.id] == ss {
		delete(s.byID, ss.id)
	}
}
