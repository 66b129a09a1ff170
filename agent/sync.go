package agent

import (
	"context"
	"time"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// syncLoop keeps a Sync stream to the console open: it says what the box
// stored, stores each batch and its revision in one transaction, then
// acknowledges it. A batch that was stored but not acknowledged (a crash in
// between) comes again and is recognised by its revision.
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
		case <-time.After(time.Second):
		}
	}
}

func (a *Agent) syncOnce(ctx context.Context, c edgeboxv1.ConsoleServiceClient) error {
	rev, err := a.local.Revision()
	if err != nil {
		return err
	}
	stream, err := c.Sync(ctx)
	if err != nil {
		return err
	}
	err = stream.Send(&edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Hello{Hello: &edgeboxv1.SyncHello{
		StoredRevision: rev, CapabilityVersion: CapabilityVersion}}})
	if err != nil {
		return err
	}
	for {
		down, err := stream.Recv()
		if err != nil {
			return err
		}
		a.received.Add(int64(len(down.GetObjects())))
		if down.GetReset_() {
			a.log.Warn("the console reset this box's desired state", "revision", down.GetRevision())
			err = a.local.Replace(down.GetObjects(), down.GetRevision())
		} else {
			_, err = a.local.Apply(down.GetObjects(), down.GetRevision())
		}
		if err != nil {
			return err
		}
		err = stream.Send(&edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Ack{Ack: &edgeboxv1.SyncAck{Revision: down.GetRevision()}}})
		if err != nil {
			return err
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
