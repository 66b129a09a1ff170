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
// between) comes again and is recognised by its revision. The same stream
// carries the reconciler's status up.
func (a *Agent) syncLoop(ctx context.Context) {
	for ctx.Err() == nil {
		wait := a.cfg.SyncRetry
		err := a.syncOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errWaitingRoom) {
			wait = a.cfg.PendingRecheck
		} else {
			a.log.Info("sync stream ended; reopening", "err", err, "in", wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
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
	conn, err := a.tc.Open(ctx, tunnel.KindSync, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	var sendMu sync.Mutex // one writer at a time
	send := func(m *edgeboxv1.SyncUp) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return edgeboxv1.WriteFrame(conn, m)
	}
	capv := uint32(CapabilityVersion)
	if v := a.cfg.Hooks.CapabilityVersion; v != nil {
		capv = *v
	}
	err = send(&edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Hello{Hello: &edgeboxv1.SyncHello{
		StoredRevision: rev, CapabilityVersion: capv}}})
	if err != nil {
		return err
	}

	// Status goes up from its own goroutine, the whole of it first.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.sendStatus(ctx, send); err != nil && ctx.Err() == nil {
			conn.Close() // the reader below sees the stream end
		}
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
		if err := send(&edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Ack{Ack: &edgeboxv1.SyncAck{Revision: ack}}}); err != nil {
			return err
		}
		a.reconciler.Kick()
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

// sendStatus sends every status, then each change, until ctx ends.
func (a *Agent) sendStatus(ctx context.Context, send func(*edgeboxv1.SyncUp) error) error {
	for full := true; ; full = false {
		ms := a.reports.take(full)
		for i, m := range ms {
			if err := send(&edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Status{Status: m}}); err != nil {
				a.reports.putBack(ms[i:])
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.reports.wake:
		}
	}
}

// SyncedRevision is the box revision of the desired state on disk.
func (a *Agent) SyncedRevision() (uint64, error) { return a.local.Revision() }

// ReceivedObjects counts desired objects received since the agent started.
func (a *Agent) ReceivedObjects() int64 { return a.received.Load() }

// DesiredObjects returns the stored desired objects of kind ("" for all).
func (a *Agent) DesiredObjects(kind string) ([]*edgeboxv1.DesiredObject, error) {
	return a.local.Objects(kind)
}
