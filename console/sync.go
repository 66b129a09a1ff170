package console

import (
	"context"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgebox/edgebox/console/desired"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// maxSyncBatch bounds the objects of one SyncDown message.
const maxSyncBatch = 256

// syncer serves Sync: catch-up from the box's stored revision, then every
// change as the store commits it. The box is the one of the tunnel
// certificate; nothing in the messages can name another.
type syncer struct {
	hub     *hub
	desired *desired.State
	log     *slog.Logger
}

func (s *syncer) Sync(stream edgeboxv1.ConsoleService_SyncServer) error {
	ctx := stream.Context()
	box, err := boxOf(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "Sync must start with a hello")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Subscribe before the first read, so no change falls between them.
	changes, unsubscribe := s.hub.subscribe(box)
	defer unsubscribe()

	log := s.log.With("box_id", box)
	capv := hello.GetCapabilityVersion()
	reset, err := s.capabilityChanged(ctx, box, capv)
	if err != nil {
		return grpcError(err)
	}
	last := hello.GetStoredRevision()
	acks := make(chan error, 1)
	go func() { acks <- s.readUp(ctx, box, stream) }()

	for first := true; ; first = false {
		objs, cur, err := s.desired.Since(ctx, box, last)
		if err != nil {
			return grpcError(err)
		}
		if last > cur {
			// The box is ahead of us: our state was restored from an older
			// copy. It must take ours whole.
			log.Warn("box is ahead of the console's desired state; resetting it", "box_rev", last, "console_rev", cur)
			reset = true
		}
		if reset {
			if last, err = s.sendReset(ctx, stream, box, capv); err != nil {
				return err
			}
			reset = false
			continue
		}
		if first {
			// What the box stored it has, whether or not its ack arrived
			// before it went away.
			if err := s.desired.Ack(ctx, box, last); err != nil {
				return grpcError(err)
			}
		}
		objs = understood(objs, capv)
		if len(objs) == 0 && cur > last {
			// Only objects the box cannot use changed: it still moves on.
			if err := stream.Send(&edgeboxv1.SyncDown{Revision: cur}); err != nil {
				return err
			}
		}
		for len(objs) > 0 {
			n := min(len(objs), maxSyncBatch)
			rev := objs[n-1].GetRevision()
			if n == len(objs) {
				rev = cur
			}
			if err := stream.Send(&edgeboxv1.SyncDown{Objects: objs[:n], Revision: rev}); err != nil {
				return err
			}
			objs = objs[n:]
		}
		last = cur
		select {
		case _, ok := <-changes:
			if !ok {
				return status.Error(codes.Unavailable, "the console is shutting down")
			}
		case err := <-acks:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// capabilityChanged records the capability version box is served with and
// reports whether it grew, in which case the box gets its state whole: it
// may now understand objects it was not sent before.
func (s *syncer) capabilityChanged(ctx context.Context, box string, capv uint32) (bool, error) {
	served, known, err := s.desired.ServedCapability(ctx, box)
	if err != nil || (known && served == capv) {
		return false, err
	}
	if err := s.desired.SetServedCapability(ctx, box, capv); err != nil {
		return false, err
	}
	return known && capv > served, nil
}

// sendReset sends the box every live object it understands, to replace
// what it stored, and returns the revision sent.
func (s *syncer) sendReset(ctx context.Context, stream edgeboxv1.ConsoleService_SyncServer, box string, capv uint32) (uint64, error) {
	live, cur, err := s.desired.Live(ctx, box)
	if err != nil {
		return 0, grpcError(err)
	}
	// A reset is one message: the box replaces its state in one transaction.
	return cur, stream.Send(&edgeboxv1.SyncDown{Objects: understood(live, capv), Revision: cur, Reset_: true})
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

// readUp handles the box's messages after its hello until the stream ends.
func (s *syncer) readUp(ctx context.Context, box string, stream edgeboxv1.ConsoleService_SyncServer) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if err := s.handleUp(ctx, box, m); err != nil {
			return err
		}
	}
}

// handleUp applies one message of box after its hello: an ack or a status
// report. box comes from the certificate, never from the message.
func (s *syncer) handleUp(ctx context.Context, box string, m *edgeboxv1.SyncUp) error {
	switch msg := m.GetMsg().(type) {
	case *edgeboxv1.SyncUp_Ack:
		if err := s.desired.Ack(ctx, box, msg.Ack.GetRevision()); err != nil {
			return grpcError(err)
		}
		if _, err := s.desired.PurgeTombstones(ctx, box); err != nil {
			return grpcError(err)
		}
		return nil
	case *edgeboxv1.SyncUp_Status:
		return grpcError(s.desired.ReportStatus(ctx, box, msg.Status))
	}
	return status.Error(codes.InvalidArgument, "after the hello, a box sends only acks and status")
}
