package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

// Bounds of what the agent accepts from the console: objects of one
// SyncDown, and bytes of one message (a reset carries the whole state).
const (
	maxDownObjects = 1 << 14
	maxDownBytes   = 64 << 20
)

// errHook is what a Hooks.AfterStore error ends the stream with.
var errHook = errors.New("stopped by a test hook")

// syncLoop keeps a Sync stream to the console open: it says what the box
// stored, stores each batch and its revision in one transaction, then
// acknowledges it. A batch that was stored but not acknowledged (a crash in
// between) comes again and is recognised by its revision. Acks and the
// reconciler's status go up on short streams of their own, so the console
// reads nothing from an idle box.
func (a *Agent) syncLoop(ctx context.Context) {
	for ctx.Err() == nil {
		wait := a.cfg.SyncRetry
		select {
		case <-a.resync: // the session this stream opens on is new anyway
		default:
		}
		err := a.syncOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errWaitingRoom) {
			wait = a.cfg.PendingRecheck
		} else {
			a.log.Info("sync stream ended; reopening", "err", err, "in", wait)
		}
		// A new session (a renewal replaced the one the stream was on)
		// opens the stream again at once.
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		case <-a.resync:
		}
	}
}

// errWaitingRoom: the console gives a box in the waiting room no state.
var errWaitingRoom = errors.New("this box waits for an operator's approval")

func (a *Agent) syncOnce(ctx context.Context) error {
	rev, err := a.local.Revision()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := a.openSync(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Abort() })
	defer stop()

	capv := uint32(CapabilityVersion)
	if v := a.cfg.Hooks.CapabilityVersion; v != nil {
		capv = *v
	}
	err = edgeboxv1.WriteFrame(conn, &edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Hello{Hello: &edgeboxv1.SyncHello{
		StoredRevision: rev, CapabilityVersion: capv}}})
	if err != nil {
		return err
	}
	// Nothing more goes up this stream; the console does not read it.
	if err := conn.CloseWrite(); err != nil {
		return err
	}

	// Acks and status go up from their own goroutine, the whole status
	// first.
	up := uploader{a: a, wake: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		up.run(ctx)
	}()

	for {
		var down edgeboxv1.SyncDown
		if err := edgeboxv1.ReadFrame(conn, &down, maxDownBytes); err != nil {
			return err
		}
		if down.GetWaitingForApproval() {
			return errWaitingRoom
		}
		if msg := down.GetError(); msg != "" {
			return fmt.Errorf("the console ended the sync stream: %s", msg)
		}
		ack, err := a.storeDown(&down)
		if err != nil {
			return err
		}
		if a.cfg.Hooks.AfterStore != nil {
			if err := a.cfg.Hooks.AfterStore(ack); err != nil {
				return fmt.Errorf("%w: %v", errHook, err)
			}
		}
		up.ack(ack)
		a.syncedAt.Store(time.Now().UnixNano())
		a.reconciler.Kick()
		a.kickUpdate()
		a.kickKeys()
	}
}

// storeDown validates and stores one message from the console, and
// returns the revision to acknowledge.
func (a *Agent) storeDown(down *edgeboxv1.SyncDown) (uint64, error) {
	if len(down.GetObjects()) > maxDownObjects {
		return 0, fmt.Errorf("the console sent %d objects in one message; at most %d are accepted", len(down.GetObjects()), maxDownObjects)
	}
	a.received.Add(int64(len(down.GetObjects())))
	if down.GetReset_() {
		a.log.Warn("the console reset this box's desired state", "revision", down.GetRevision())
		return down.GetRevision(), a.local.Replace(down.GetObjects(), down.GetRevision())
	}
	if _, err := a.local.Apply(down.GetObjects(), down.GetRevision()); err != nil {
		return 0, err
	}
	return down.GetRevision(), nil
}

// uploader sends a Sync stream's acks and status, each time as many as
// wait, on one short stream that the console answers once it handled them.
// Only the latest ack goes: it acknowledges every revision before it.
type uploader struct {
	a    *Agent
	wake chan struct{}

	mu      sync.Mutex // guards pending
	pending uint64     // revision to acknowledge; 0 when sent
}

// ack has rev acknowledged.
func (u *uploader) ack(rev uint64) {
	u.mu.Lock()
	u.pending = rev
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// The console's answer to acks and status: how long the box waits for it
// by default (Config.UpAnswerTimeout), and how large it may be (an empty
// message, or why they were refused).
const (
	upAnswerTimeout = 30 * time.Second
	maxAnswerBytes  = 64 << 10
)

// Waits between tries of acks and status the console did not take: a busy
// console (its stream backlog full, or slow to answer) is asked again
// later on the same session, never by dropping the stream it catches the
// box up on, which would have it redo that work.
const (
	upRetryMin = time.Second
	upRetryMax = 30 * time.Second
)

// run sends every status, then acks and each change, until ctx ends. What
// the console does not take is sent again after a wait that grows with each
// failure in a row, with the newest ack and everything not sent.
func (u *uploader) run(ctx context.Context) {
	a := u.a
	retry := tunnel.Backoff{Min: upRetryMin, Max: upRetryMax}
	failures := 0
	for full := true; ; {
		var msgs []*edgeboxv1.SyncUp
		u.mu.Lock()
		if u.pending != 0 {
			msgs = append(msgs, &edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Ack{Ack: &edgeboxv1.SyncAck{Revision: u.pending}}})
			u.pending = 0
		}
		u.mu.Unlock()
		statuses := a.reports.take(full)
		for _, m := range statuses {
			msgs = append(msgs, &edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Status{Status: m}})
		}
		if len(msgs) > 0 {
			if err := a.sendUp(ctx, msgs); err != nil {
				if ctx.Err() != nil {
					return
				}
				a.reports.putBack(statuses)
				u.keep(msgs)
				wait := retry.Delay(failures)
				failures++
				a.log.Info("the console did not take acks and status; trying again", "err", err, "in", wait.Round(time.Millisecond), "failures", failures)
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
				// Statuses taken are not put back: the next try sends
				// them all, as a new stream would.
				full = true
				continue
			}
			failures = 0
			if full {
				// The console took the whole status on this stream.
				a.syncedAt.Store(time.Now().UnixNano())
				a.kickUpdate()
			}
		}
		full = false
		select {
		case <-ctx.Done():
			return
		case <-a.reports.wake:
		case <-u.wake:
		}
	}
}

// keep puts back the ack of msgs that were not taken, unless a newer one
// is pending.
func (u *uploader) keep(msgs []*edgeboxv1.SyncUp) {
	for _, m := range msgs {
		if ack := m.GetAck(); ack != nil {
			u.mu.Lock()
			u.pending = max(u.pending, ack.GetRevision())
			u.mu.Unlock()
		}
	}
}

// sendUp sends msgs on a stream of their own and waits for the console to
// say it handled them.
func (a *Agent) sendUp(ctx context.Context, msgs []*edgeboxv1.SyncUp) error {
	if a.cfg.Hooks.BeforeSendUp != nil {
		a.cfg.Hooks.BeforeSendUp(msgs)
	}
	conn, err := a.openSync(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Abort() })
	defer stop()
	for _, m := range msgs {
		if err := edgeboxv1.WriteFrame(conn, m); err != nil {
			return err
		}
	}
	// The console answers once the box's side is closed.
	if err := conn.CloseWrite(); err != nil {
		return err
	}
	conn.SetReadDeadline(time.Now().Add(a.cfg.UpAnswerTimeout))
	var answer edgeboxv1.SyncDown
	if err := edgeboxv1.ReadFrame(conn, &answer, maxAnswerBytes); err != nil {
		return fmt.Errorf("waiting for the console to take acks and status: %w", err)
	}
	if msg := answer.GetError(); msg != "" {
		return fmt.Errorf("the console refused acks or status: %s", msg)
	}
	return nil
}

// openSync opens a Sync stream to the console.
func (a *Agent) openSync(ctx context.Context) (*tunnel.Conn, error) {
	c, err := a.tc.Open(ctx, tunnel.KindSync, nil)
	if err != nil {
		return nil, err
	}
	return c.(*tunnel.Conn), nil // every tunnel stream is one
}

// SyncedRevision is the box revision of the desired state on disk.
func (a *Agent) SyncedRevision() (uint64, error) { return a.local.Revision() }

// ReceivedObjects counts desired objects received since the agent started.
func (a *Agent) ReceivedObjects() int64 { return a.received.Load() }

// DesiredObjects returns the stored desired objects of kind ("" for all).
func (a *Agent) DesiredObjects(kind string) ([]*edgeboxv1.DesiredObject, error) {
	return a.local.Objects(kind)
}
