package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// ServerConfig configures the console side.
type ServerConfig struct {
	Config
	// Identify returns the box ID of a verified TLS connection, or an
	// error when the connection must not become a session (revoked, no
	// identity). It is called after the handshake.
	Identify func(tls.ConnectionState) (string, error)
	// Admit, if set, decides whether an identified box may start a
	// session now. It returns 0 to admit it, or how long the box should
	// wait before it dials again: the box is told so and the connection
	// closed, before any session work. It must not block. ctx is the one
	// given to ServeConn, with what the caller put in it (the console's
	// port: the place it held for the box before its handshake).
	Admit func(ctx context.Context, boxID string) (retryAfter time.Duration)
	// Name is this side's identity in stream addresses; "console" if empty.
	Name string
	// OnSession, if set, is called synchronously when a session comes up
	// and when it ends; it must not block.
	OnSession func(SessionEvent)
}

// Validate reports the first setting that cannot work.
func (c ServerConfig) Validate() error {
	if c.Identify == nil {
		return errors.New("tunnel: ServerConfig.Identify is required")
	}
	return c.Config.Validate()
}

// SessionEvent tells the owner of a Server that a box came or went.
type SessionEvent struct {
	BoxID   string
	Session *Session
	Up      bool
	// Replaced, when a session ended, says the box has a newer session
	// that took its place: the box did not go away.
	Replaced bool
}

// Server is the console side of the tunnel: it turns handshaken TLS
// connections into sessions, keeps one session per box (a new one replaces
// the old), and routes streams from every box to the listener of their
// kind. Stream addresses carry the box ID.
type Server struct {
	cfg     ServerConfig
	log     *slog.Logger
	metrics *Metrics
	routes  listeners

	// mu guards sessions and closed. Whether a box is online is asked
	// for every box an operator or a scrape looks at, so lookups share it.
	mu       sync.RWMutex
	sessions map[string]*Session
	closed   bool
	wg       sync.WaitGroup // live sessions
}

// NewServer validates cfg and returns a Server; it starts nothing.
func NewServer(cfg ServerConfig, log *slog.Logger, m *Metrics) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		cfg.Name = "console"
	}
	return &Server{
		cfg: cfg, log: log.With("component", "tunnel"), metrics: m,
		routes:   listeners{self: cfg.Name, backlog: cfg.ListenBacklog},
		sessions: make(map[string]*Session),
	}, nil
}

// Listen returns the listener for streams of kind opened by boxes.
func (s *Server) Listen(kind Kind) *Listener { return s.routes.listen(kind) }

// ServeConn starts a session on conn, whose TLS handshake must be
// complete, and returns once it is up (or refused; it is refused when ctx
// is done). The session then runs on its own until it ends, the box is
// dropped or replaced, or the server closes; conn is closed with it. No
// goroutine waits on it: an idle box costs the console yamux's two
// goroutines and one that accepts streams.
func (s *Server) ServeConn(ctx context.Context, conn *tls.Conn) error {
	if err := ctx.Err(); err != nil {
		conn.Close()
		return err
	}
	conn.SetWriteDeadline(time.Now().Add(s.cfg.OpenTimeout))
	boxID, err := s.cfg.Identify(conn.ConnectionState())
	if err != nil {
		s.metrics.handshake("refused")
		writeVerdict(conn, err.Error())
		conn.Close()
		return fmt.Errorf("tunnel: refusing session: %w", err)
	}
	if s.cfg.Admit != nil {
		if after := s.cfg.Admit(ctx, boxID); after > 0 {
			s.metrics.handshake("busy")
			writeBusy(conn, after)
			conn.Close()
			return fmt.Errorf("tunnel: %s: %w", boxID, &BusyError{RetryAfter: after})
		}
	}
	if err := writeVerdict(conn, ""); err != nil {
		s.metrics.handshake("failed")
		conn.Close()
		return fmt.Errorf("tunnel: greeting %s: %w", boxID, err)
	}
	conn.SetWriteDeadline(time.Time{})
	hc := watchReads(yamuxConn(conn))
	ys, err := yamux.Server(hc, s.cfg.yamux())
	if err != nil {
		conn.Close()
		return err
	}
	sess := newSession(ys, s.cfg.Name, boxID, s.cfg.Config, &s.routes, s.log, s.metrics)
	sess.hears(hc)
	// Set before the session is published: from then on Drop, a
	// replacement or Close may end it, and its end must give back what
	// Close waits for.
	sess.onEnd = func() {
		conn.Close()
		s.metrics.sessionUp(-1)
		s.mu.Lock()
		replaced := s.sessions[boxID] != sess
		if !replaced {
			delete(s.sessions, boxID)
		}
		s.mu.Unlock()
		if s.cfg.OnSession != nil {
			s.cfg.OnSession(SessionEvent{BoxID: boxID, Session: sess, Up: false, Replaced: replaced})
		}
		s.wg.Done()
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ys.Close()
		return ErrClosed
	}
	old := s.sessions[boxID]
	s.sessions[boxID] = sess
	s.wg.Add(1)
	s.metrics.sessionUp(1) // before anyone can end it and count it down
	s.mu.Unlock()

	if old != nil {
		s.log.Info("box reconnected, replacing its old session", "box_id", boxID)
		old.Close()
	}
	s.metrics.handshake("ok")
	if s.cfg.OnSession != nil {
		s.cfg.OnSession(SessionEvent{BoxID: boxID, Session: sess, Up: true})
	}
	sess.start()
	return nil
}

// Session returns the live session of a box.
func (s *Server) Session(boxID string) (*Session, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sess, ok := s.sessions[boxID]
	return sess, ok
}

// Sessions returns every live session.
func (s *Server) Sessions() []*Session {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		out = append(out, sess)
	}
	return out
}

// Len returns how many boxes have a live session.
func (s *Server) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.sessions)
}

// ErrOffline is returned by Open for a box with no live session.
var ErrOffline = errors.New("tunnel: box is not connected")

// Open opens a stream of kind to a box.
func (s *Server) Open(ctx context.Context, boxID string, kind Kind, meta map[string]string) (net.Conn, error) {
	sess, ok := s.Session(boxID)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrOffline, boxID)
	}
	return sess.Open(ctx, kind, meta)
}

// Drop closes a box's session and all its streams at once, reporting
// whether there was one.
func (s *Server) Drop(boxID string) bool {
	sess, ok := s.Session(boxID)
	if ok {
		sess.Close()
	}
	return ok
}

// Close tells every box that the console is going away (so it comes back
// within its rejoin window, not after its grown backoff; see kindGoAway),
// then drops every session, closes every listener and waits for every
// session to end. The goodbyes take at most two seconds.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	all := make([]*Session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		all = append(all, sess)
	}
	s.mu.Unlock()
	sayGoodbyes(all, s.log)
	for _, sess := range all {
		sess.Close()
	}
	s.wg.Wait()
	s.routes.closeAll()
	return nil
}
