package console

import (
	"context"
	"errors"
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

// syncServer serves the tunnel's "sync" streams: catch-up from the box's
// stored revision, then every change as the store commits it, pushed by a
// small pool of workers the hub wakes. A connected idle box costs one
// goroutine, the one reading its acks and status. The box is the one of
// the tunnel certificate; nothing in the messages can name another.
type syncServer struct {
	hub      *hub
	desired  *desired.State
	approved func(box string) (bool, error)
	usb      usbReporter // nil: USB inventories are ignored
	log      *slog.Logger

	mu     sync.Mutex // guards queue and closed
	cond   *sync.Cond
	queue  []*syncConn
	closed bool
}

func newSyncServer(h *hub, d *desired.State, approved func(string) (bool, error), usb usbReporter, log *slog.Logger) *syncServer {
	s := &syncServer{hub: h, desired: d, approved: approved, usb: usb, log: log}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// usbReporter takes what a status report says of the box's USB keys: its
// whole inventory, and what it did to keys.
type usbReporter func(ctx context.Context, box string, st *edgeboxv1.SyncStatus) error

// syncConn is one box's Sync stream.
type syncConn struct {
	box    string
	conn   net.Conn
	capv   uint32
	queued atomic.Bool

	mu    sync.Mutex // one writer at a time; guards last and begun
	last  uint64     // the revision sent last
	begun bool       // the catch-up after the hello is done
}

// write sends m, giving up after syncWriteTimeout. Hold c.mu.
func (c *syncConn) write(m *edgeboxv1.SyncDown) error {
	c.conn.SetWriteDeadline(time.Now().Add(syncWriteTimeout))
	return edgeboxv1.WriteFrame(c.conn, m)
}

// refuse tells the box why its stream ends.
func (c *syncConn) refuse(msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.write(&edgeboxv1.SyncDown{Error: msg})
}

// serve accepts Sync streams from l until ctx ends, and runs the workers;
// it returns when every stream it served has ended.
func (s *syncServer) serve(ctx context.Context, l net.Listener) {
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
		l.Close()
	})
	defer stop()
	for {
		c, err := l.Accept()
		if err != nil {
			break
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.handle(ctx, c) }()
	}
	wg.Wait()
}

// handle runs one box's stream: the hello and catch-up, then its acks and
// status until the stream ends.
func (s *syncServer) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	tc, ok := c.(*tunnel.Conn)
	if !ok || tc.Peer() == "" {
		return
	}
	sc := &syncConn{box: tc.Peer(), conn: c}
	log := s.log.With("box_id", sc.box)

	c.SetReadDeadline(time.Now().Add(syncHelloTimeout))
	var first edgeboxv1.SyncUp
	if err := edgeboxv1.ReadFrame(c, &first, maxSyncUp); err != nil {
		log.Debug("sync stream ended before its hello", "err", err)
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
			sc.refuse(publicError(err))
		}
		return
	}
	c.SetReadDeadline(time.Time{})
	hello := first.GetHello()
	if hello == nil {
		sc.refuse("Sync must start with a hello")
		return
	}
	sc.capv = hello.GetCapabilityVersion()
	sc.last = hello.GetStoredRevision()
	// Subscribe before the first read, so no change falls between them.
	// A worker does the catch-up: the work of a burst of reconnecting
	// boxes is spread over the pool, and this goroutine, which stays for
	// the life of the stream, keeps a small stack.
	unsubscribe := s.hub.subscribe(sc.box, func() { s.enqueue(sc) })
	defer unsubscribe()
	s.enqueue(sc)
	for {
		var m edgeboxv1.SyncUp
		err := edgeboxv1.ReadFrame(c, &m, maxSyncUp)
		if err == nil {
			err = s.handleUp(ctx, sc.box, &m)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
				log.Info("sync stream ended", "err", err)
				sc.refuse(publicError(err))
			}
			return
		}
	}
}

// publicError is what a box is told when its stream ends on err.
func publicError(err error) string {
	if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, edgeboxv1.ErrFrameTooLarge) {
		return err.Error()
	}
	return "console error; its log says why"
}

// push sends the box what changed since it was last sent anything; the
// first push after the hello begins the stream. Hold sc.mu.
func (s *syncServer) push(ctx context.Context, sc *syncConn) error {
	if sc.begun {
		return s.catchUp(ctx, sc, false)
	}
	ok, err := s.approved(sc.box)
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
func (s *syncServer) begin(ctx context.Context, sc *syncConn) error {
	reset, err := s.capabilityChanged(ctx, sc.box, sc.capv)
	if err != nil {
		return err
	}
	// A box ahead of the console cannot ack; catchUp resets it.
	if err := s.desired.Ack(ctx, sc.box, sc.last); err != nil && !errors.Is(err, errdefs.ErrInvalid) {
		return err
	}
	return s.catchUp(ctx, sc, reset)
}

// catchUp sends the box everything after the revision it has, only the
// latest of each object, in batches; or, with reset (or when the box is
// ahead of the console), its whole state to replace its own. Hold sc.mu.
func (s *syncServer) catchUp(ctx context.Context, sc *syncConn, reset bool) error {
	objs, cur, err := s.desired.Since(ctx, sc.box, sc.last)
	if err != nil {
		return err
	}
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
func (s *syncServer) enqueue(sc *syncConn) {
	if sc.queued.Swap(true) {
		return
	}
	s.mu.Lock()
	s.queue = append(s.queue, sc)
	s.cond.Signal()
	s.mu.Unlock()
}

// work pushes changes to woken boxes until the server closes.
func (s *syncServer) work(ctx context.Context) {
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
		sc.mu.Lock()
		err := s.push(ctx, sc)
		if err != nil && !errors.Is(err, errWaitingRoom) {
			s.log.Info("sync push failed; closing the stream", "box_id", sc.box, "err", err)
			sc.write(&edgeboxv1.SyncDown{Error: publicError(err)})
		}
		sc.mu.Unlock()
		if err != nil {
			// The box's reader sees the stream end and cleans up; the box
			// reconnects and catches up from what it stored.
			sc.conn.Close()
		}
	}
}

// capabilityChanged records the capability version box is served with and
// reports whether it grew, in which case the box gets its state whole: it
// may now understand objects it was not sent before.
func (s *syncServer) capabilityChanged(ctx context.Context, box string, capv uint32) (bool, error) {
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

// handleUp applies one message of box after its hello: an ack or a status
// report. box comes from the certificate, never from the message.
func (s *syncServer) handleUp(ctx context.Context, box string, m *edgeboxv1.SyncUp) error {
	switch msg := m.GetMsg().(type) {
	case *edgeboxv1.SyncUp_Ack:
		if err := s.desired.Ack(ctx, box, msg.Ack.GetRevision()); err != nil {
			return err
		}
		_, err := s.desired.PurgeTombstones(ctx, box)
		return err
	case *edgeboxv1.SyncUp_Status:
		if s.usb != nil {
			if err := s.usb(ctx, box, msg.Status); err != nil {
				return err
			}
		}
		return s.desired.ReportStatus(ctx, box, msg.Status)
	}
	return errdefs.Invalid("after the hello, a box sends only acks and status")
}
