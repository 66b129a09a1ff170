// Package boxsync serves the boxes' Sync streams: each box's desired
// state, caught up from the revision it stored and then pushed as the
// store commits changes (a hub wakes the boxes whose objects changed,
// from one watch of the desired state), and the acks and status reports
// boxes send up.
package boxsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

// Sync limits.
const (
	maxSyncBatch     = 256     // objects of one SyncDown message
	maxSyncUp        = 1 << 20 // bytes of one message from a box
	syncHelloTimeout = 30 * time.Second
	// syncWriteTimeout bounds a write to a box that stopped reading.
	syncWriteTimeout = 30 * time.Second
	// syncWorkers push changes to boxes; a box costs none of them while
	// nothing changes for it.
	syncWorkers = 32
)

// Server serves the tunnel's "sync" streams. A box keeps one open,
// begun with its hello: the catch-up from its stored revision goes down it,
// then every change as the store commits it, pushed by a small pool of
// workers the hub wakes. Nothing reads that stream after the hello, so a
// connected idle box costs no goroutine here: acks and status come up on
// short streams of their own, each answered when handled. The box is the
// one of the tunnel certificate; nothing in the messages can name another.
type Server struct {
	hub      *hub // wakes the boxes whose state changed
	desired  *desired.State
	approved Approved
	status   StatusHook // nil: only the desired state takes status reports
	caughtUp func(box string)
	before   func(ctx context.Context, box string) error // nil but in fault-injection tests
	l        net.Listener
	now      func() time.Time // the lag metrics' clock
	log      *slog.Logger

	mu     sync.Mutex // guards queue, boxes and closed
	cond   *sync.Cond
	queue  []*syncConn
	boxes  map[string]*syncConn // each box's open stream
	closed bool
}

// Approved reports whether a box may have its desired state: a box that
// waits for an operator's approval is told so, and its stream ends.
type Approved func(ctx context.Context, box string) (bool, error)

// StatusHook takes a status report of box before the desired state
// records it; its error refuses the report.
type StatusHook func(ctx context.Context, box string, st *edgeboxv1.SyncStatus) error

// Config is what a Server serves and whom it tells.
type Config struct {
	Desired  *desired.State
	Approved Approved
	// Status, if set, takes each status report before the desired state
	// records it.
	Status StatusHook
	// CaughtUp, if set, is told once a box's new stream has begun: its
	// catch-up is written, or it was told it waits for approval. It must
	// not block.
	CaughtUp func(box string)
	// Before, for fault-injection tests, runs before a box's new stream
	// is begun (its catch-up) and before a stream of its acks and status
	// is handled; its error ends that stream as a failure of the console
	// would. Nil in production.
	Before func(ctx context.Context, box string) error
	// Listener gives the tunnel's "sync" streams.
	Listener net.Listener
	// Now tells the time for the sync lag metrics; nil is time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// New returns a Server of cfg.Desired's state on cfg.Listener. It starts
// nothing.
func New(cfg Config) *Server {
	log := cfg.Log.With("component", "sync")
	s := &Server{desired: cfg.Desired, approved: cfg.Approved, status: cfg.Status, caughtUp: cfg.CaughtUp,
		before: cfg.Before, l: cfg.Listener, now: cfg.Now, log: log, boxes: make(map[string]*syncConn)}
	if s.now == nil {
		s.now = time.Now
	}
	s.cond = sync.NewCond(&s.mu)
	s.hub = newHub(cfg.Desired, s.wake, s.wakeAll, s.moved, log)
	return s
}

// Run watches the desired state and serves Sync streams until ctx ends,
// then closes every stream and the listener and returns nil once each
// stream it served has ended. If the listener fails first, it returns
// that error, having closed everything the same way.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The watch starts before any Sync stream can read the state, so no
	// change falls between a stream's first read and the hub.
	w := s.hub.watch(ctx)
	hubDone := make(chan struct{})
	go func() { defer close(hubDone); s.hub.run(ctx, w) }()
	defer func() { cancel(); <-hubDone }()
	return s.serve(ctx)
}

// wake queues box's stream for a push, if it has one open.
func (s *Server) wake(box string) {
	s.mu.Lock()
	sc := s.boxes[box]
	s.mu.Unlock()
	if sc != nil {
		s.enqueue(sc)
	}
}

// moved records that box's revision is now rev, if it has a stream open.
func (s *Server) moved(box string, rev uint64) {
	s.mu.Lock()
	sc := s.boxes[box]
	s.mu.Unlock()
	if sc != nil {
		sc.lag.moved(rev, s.now())
	}
}

// wakeAll queues every open stream.
func (s *Server) wakeAll() {
	for _, sc := range s.open() {
		s.enqueue(sc)
	}
}

// open returns the open streams.
func (s *Server) open() []*syncConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	open := make([]*syncConn, 0, len(s.boxes))
	for _, sc := range s.boxes {
		open = append(open, sc)
	}
	return open
}

// syncConn is one box's open Sync stream.
type syncConn struct {
	box     string
	conn    *tunnel.Conn
	capv    uint32
	queued  atomic.Bool
	stopped atomic.Bool

	mu    sync.Mutex // one writer at a time; guards last and begun
	last  uint64     // the revision sent last
	begun bool       // the catch-up after the hello is done

	lag lag // how far the box is behind, for the metrics
}

// write sends m, giving up after syncWriteTimeout. Hold c.mu.
func (c *syncConn) write(m *edgeboxv1.SyncDown) error {
	c.conn.SetWriteDeadline(time.Now().Add(syncWriteTimeout))
	return edgeboxv1.WriteFrame(c.conn, m)
}

// serve accepts Sync streams until ctx ends or the listener fails, and
// runs the workers; it returns when every stream it served has ended.
func (s *Server) serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l := s.l
	var wg sync.WaitGroup
	for range syncWorkers {
		wg.Add(1)
		go func() { defer wg.Done(); s.work(ctx) }()
	}
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.closed = true
		s.cond.Broadcast()
		s.mu.Unlock()
		for _, sc := range s.open() {
			s.stop(sc)
		}
		l.Close()
	})
	defer stop()
	var failed error
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				failed = fmt.Errorf("sync: accepting streams: %w", err)
			}
			break
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.handle(ctx, c) }()
	}
	cancel() // a failed listener stops the workers and streams too
	wg.Wait()
	return failed
}

// handle reads a stream's first message. A hello opens the box's stream
// (replacing any it had) and leaves it to the workers; acks and status are
// handled until the box closes its side, and answered.
func (s *Server) handle(ctx context.Context, c net.Conn) {
	tc, ok := c.(*tunnel.Conn)
	if !ok || tc.Peer() == "" {
		c.Close()
		return
	}
	box := tc.Peer()
	// Until it is attached (then stop closes it), the stream closes when
	// the server stops, not at its read deadline.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	c.SetReadDeadline(time.Now().Add(syncHelloTimeout))
	var first edgeboxv1.SyncUp
	if err := edgeboxv1.ReadFrame(c, &first, maxSyncUp); err != nil {
		s.log.Debug("sync stream ended before its first message", "box_id", box, "err", err)
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
			refuse(c, publicError(err))
		}
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	switch first.GetMsg().(type) {
	case *edgeboxv1.SyncUp_Hello:
		s.attach(tc, first.GetHello())
	case *edgeboxv1.SyncUp_Ack, *edgeboxv1.SyncUp_Status:
		s.receive(ctx, tc, &first)
	default:
		refuse(c, "a Sync stream starts with a hello, or carries acks and status")
		c.Close()
	}
}

// attach makes c the box's stream and has a worker catch it up. The stream
// stays open with no goroutine of its own until a push to it fails, the
// box says hello on another, its session ends or the server closes.
func (s *Server) attach(c *tunnel.Conn, hello *edgeboxv1.SyncHello) {
	sc := &syncConn{box: c.Peer(), conn: c, capv: hello.GetCapabilityVersion(), last: hello.GetStoredRevision()}
	c.ReleaseReadBuffer() // the hello was its only read
	// Known to wake before the first read, so no change falls between them.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.stop(sc)
		return
	}
	old := s.boxes[sc.box]
	s.boxes[sc.box] = sc
	s.mu.Unlock()
	if old != nil {
		s.stop(old)
	}
	s.enqueue(sc)
}

// stop closes sc's stream and forgets it. It is idempotent.
func (s *Server) stop(sc *syncConn) {
	if sc.stopped.Swap(true) {
		return
	}
	sc.conn.Close()
	s.mu.Lock()
	if s.boxes[sc.box] == sc {
		delete(s.boxes, sc.box)
	}
	s.mu.Unlock()
}

// SessionEnded closes the Sync stream that sess carried, if any. It is
// part of the tunnel server's OnSession, and does not block.
func (s *Server) SessionEnded(box string, sess *tunnel.Session) {
	s.mu.Lock()
	sc := s.boxes[box]
	s.mu.Unlock()
	if sc != nil && sc.conn.Session() == sess {
		s.stop(sc)
	}
}

// receive handles the acks and status of one stream, first and then what
// follows until the box closes its side, and answers with an empty message
// or the reason it stopped.
func (s *Server) receive(ctx context.Context, c *tunnel.Conn, first *edgeboxv1.SyncUp) {
	defer c.Close()
	box := c.Peer()
	if s.before != nil {
		if err := s.before(ctx, box); err != nil {
			if ctx.Err() == nil {
				refuse(c, publicError(err))
			}
			return
		}
	}
	m := first
	for {
		if err := s.handleUp(ctx, box, m); err != nil {
			if ctx.Err() == nil {
				s.log.Info("refused a box's sync message", "box_id", box, "err", err)
				refuse(c, publicError(err))
			}
			return
		}
		m = &edgeboxv1.SyncUp{}
		c.SetReadDeadline(time.Now().Add(syncHelloTimeout))
		err := edgeboxv1.ReadFrame(c, m, maxSyncUp)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
				refuse(c, publicError(err))
			}
			return
		}
	}
	c.SetWriteDeadline(time.Now().Add(syncWriteTimeout))
	edgeboxv1.WriteFrame(c, &edgeboxv1.SyncDown{})
}

// acked records, for the lag metrics, that box stored everything up to
// rev, if it has a stream open.
func (s *Server) acked(box string, rev uint64) {
	s.mu.Lock()
	sc := s.boxes[box]
	s.mu.Unlock()
	if sc != nil {
		sc.lag.ack(rev)
	}
}

// refuse tells the box why its stream ends.
func refuse(c net.Conn, msg string) {
	c.SetWriteDeadline(time.Now().Add(syncWriteTimeout))
	edgeboxv1.WriteFrame(c, &edgeboxv1.SyncDown{Error: msg})
}

// publicError is what a box is told when its stream ends on err: why what
// it sent is invalid, or only that the console failed.
func publicError(err error) string {
	if errors.Is(err, errdefs.ErrInvalid) {
		return err.Error()
	}
	return "console error; its log says why"
}

// push sends the box what changed since it was last sent anything; the
// first push after the hello begins the stream. Hold sc.mu.
func (s *Server) push(ctx context.Context, sc *syncConn) error {
	if sc.begun {
		return s.catchUp(ctx, sc, false)
	}
	if s.before != nil {
		if err := s.before(ctx, sc.box); err != nil {
			return err
		}
	}
	ok, err := s.approved(ctx, sc.box)
	if err != nil {
		return err
	}
	if !ok {
		sc.write(&edgeboxv1.SyncDown{Error: "this box waits for an operator's approval", WaitingForApproval: true})
		return errWaitingRoom
	}
	if err := s.begin(ctx, sc); err != nil {
		return err
	}
	sc.begun = true
	return nil
}

// errWaitingRoom ends the stream of a box that is not approved.
var errWaitingRoom = errors.New("the box waits for approval")

// begin records the box's capability and its stored revision as
// acknowledged (it has them, whether or not its last ack arrived), then
// catches it up. Hold sc.mu.
func (s *Server) begin(ctx context.Context, sc *syncConn) error {
	reset, err := s.capabilityChanged(ctx, sc.box, sc.capv)
	if err != nil {
		return err
	}
	// A box ahead of the console cannot ack; catchUp resets it.
	switch err := s.desired.Ack(ctx, sc.box, sc.last); {
	case err == nil:
		sc.lag.ack(sc.last)
	case !errors.Is(err, errdefs.ErrInvalid):
		return err
	}
	return s.catchUp(ctx, sc, reset)
}

// catchUp sends the box everything after the revision it has, only the
// latest of each object, in batches; or, with reset (or when the box is
// ahead of the console), its whole state to replace its own. Hold sc.mu.
func (s *Server) catchUp(ctx context.Context, sc *syncConn, reset bool) error {
	objs, cur, err := s.desired.Since(ctx, sc.box, sc.last)
	if err != nil {
		return err
	}
	sc.lag.moved(cur, s.now())
	if sc.last > cur {
		// Our state was restored from an older copy. The box must take
		// ours whole.
		s.log.Warn("box is ahead of the console's desired state; resetting it", "box_id", sc.box, "box_rev", sc.last, "console_rev", cur)
		reset = true
	}
	if reset {
		live, cur, err := s.desired.Live(ctx, sc.box)
		if err != nil {
			return err
		}
		// A reset is one message: the box replaces its state in one
		// transaction.
		if err := sc.write(&edgeboxv1.SyncDown{Objects: understood(live, sc.capv), Revision: cur, Reset_: true}); err != nil {
			return err
		}
		sc.last = cur
		return nil
	}
	objs = understood(objs, sc.capv)
	if len(objs) == 0 && cur > sc.last {
		// Only objects the box cannot use changed: it still moves on.
		if err := sc.write(&edgeboxv1.SyncDown{Revision: cur}); err != nil {
			return err
		}
	}
	for len(objs) > 0 {
		n := min(len(objs), maxSyncBatch)
		rev := objs[n-1].GetRevision()
		if n == len(objs) {
			rev = cur
		}
		if err := sc.write(&edgeboxv1.SyncDown{Objects: objs[:n], Revision: rev}); err != nil {
			return err
		}
		objs = objs[n:]
	}
	sc.last = cur
	return nil
}

// enqueue asks a worker to push sc's changes; a box already waiting for
// one is not queued twice.
func (s *Server) enqueue(sc *syncConn) {
	if sc.queued.Swap(true) {
		return
	}
	s.mu.Lock()
	s.queue = append(s.queue, sc)
	s.cond.Signal()
	s.mu.Unlock()
}

// work pushes changes to woken boxes until the server closes.
func (s *Server) work(ctx context.Context) {
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		if s.closed {
			s.mu.Unlock()
			return
		}
		sc := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.mu.Unlock()

		// Cleared before reading, so a change from now on queues it again.
		sc.queued.Store(false)
		if sc.stopped.Load() {
			continue
		}
		sc.mu.Lock()
		begun := sc.begun
		err := s.push(ctx, sc)
		if !begun && s.caughtUp != nil && (sc.begun || errors.Is(err, errWaitingRoom)) {
			s.caughtUp(sc.box)
		}
		if err != nil && !errors.Is(err, errWaitingRoom) {
			s.log.Info("sync push failed; closing the stream", "box_id", sc.box, "err", err)
			sc.write(&edgeboxv1.SyncDown{Error: publicError(err)})
		}
		sc.mu.Unlock()
		if err != nil {
			// The box sees its stream end, opens another and catches up
			// from what it stored.
			s.stop(sc)
		}
	}
}

// capabilityChanged records the capability version box is served with and
// reports whether it grew, in which case the box gets its state whole: it
// may now understand objects it was not sent before.
func (s *Server) capabilityChanged(ctx context.Context, box string, capv uint32) (bool, error) {
	served, known, err := s.desired.ServedCapability(ctx, box)
	if err != nil || (known && served == capv) {
		return false, err
	}
	if err := s.desired.SetServedCapability(ctx, box, capv); err != nil {
		return false, err
	}
	return known && capv > served, nil
}

// understood filters objs, in place, to the kinds a box of capability
// version capv understands.
func understood(objs []*edgeboxv1.DesiredObject, capv uint32) []*edgeboxv1.DesiredObject {
	out := objs[:0]
	for _, o := range objs {
		if desired.MinCapability(o.GetKind()) <= capv {
			out = append(out, o)
		}
	}
	return out
}

// handleUp applies one message of box: an ack or a status report. box
// comes from the certificate, never from the message.
func (s *Server) handleUp(ctx context.Context, box string, m *edgeboxv1.SyncUp) error {
	switch msg := m.GetMsg().(type) {
	case *edgeboxv1.SyncUp_Ack:
		if err := s.desired.Ack(ctx, box, msg.Ack.GetRevision()); err != nil {
			return err
		}
		s.acked(box, msg.Ack.GetRevision())
		_, err := s.desired.PurgeTombstones(ctx, box)
		return err
	case *edgeboxv1.SyncUp_Status:
		if s.status != nil {
			if err := s.status(ctx, box, msg.Status); err != nil {
				return err
			}
		}
		return s.desired.ReportStatus(ctx, box, msg.Status)
	}
	return errdefs.Invalid("a Sync stream of acks and status carries nothing else")
}
