package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// maxDownObjects bounds the objects of one SyncDown the agent accepts.
const maxDownObjects = 1 << 14

// errHook is what a Hooks.AfterStore error ends the stream with.
var errHook = errors.New("stopped by a test hook")

// syncLoop keeps a Sync stream to the console open: it says what the box
// stored, stores each batch and its revision in one transaction, then
// acknowledges it. A batch that was stored but not acknowledged (a crash in
// between) comes again and is recognised by its revision. The same stream
// carries the reconciler's status up.
func (a *Agent) syncLoop(ctx context.Context, c edgeboxv1.ConsoleServiceClient) {
	for ctx.Err() == nil {
		err := a.syncOnce(ctx, c)
		if ctx.Err() != nil {
			return
		}
		a.log.Info("sync stream ended; reopening", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(a.cfg.SyncRetry):
		}
	}
}

func (a *Agent) syncOnce(ctx context.Context, c edgeboxv1.ConsoleServiceClient) error {
	rev, err := a.local.Revision()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Sync(ctx)
	if err != nil {
		return err
	}
	var sendMu sync.Mutex // gRPC allows one Send at a time
	send := func(m *edgeboxv1.SyncUp) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
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
	statusErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		statusErr <- a.sendStatus(ctx, send)
	}()

	for {
		down, err := stream.Recv()
		if err != nil {
			select {
			case serr := <-statusErr:
				if serr != nil && ctx.Err() == nil {
					return serr
				}
			default:
			}
			return err
		}
		ack, err := a.storeDown(down)
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
