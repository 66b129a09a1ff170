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

	acks := make(chan error, 1)
	go func() { acks <- s.readAcks(ctx, box, stream) }()

	log := s.log.With("box_id", box)
	last := hello.GetStoredRevision()
	for {
		objs, cur, err := s.desired.Since(ctx, box, last)
		if err != nil {
			return grpcError(err)
		}
		if last > cur {
			// The box is ahead of us: our state was restored from an older
			// copy. It must take ours whole.
			all, cur, err := s.desired.Since(ctx, box, 0)
			if err != nil {
				return grpcError(err)
			}
			log.Warn("box is ahead of the console's desired state; resetting it", "box_rev", last, "console_rev", cur)
			live := all[:0]
			for _, o := range all {
				if !o.GetDeleted() {
					live = append(live, o)
				}
			}
			if err := stream.Send(&edgeboxv1.SyncDown{Objects: live, Revision: cur, Reset_: true}); err != nil {
				return err
			}
			last = cur
			continue
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

// readAcks records the box's acknowledgements until the stream ends.
func (s *syncer) readAcks(ctx context.Context, box string, stream edgeboxv1.ConsoleService_SyncServer) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		a := m.GetAck()
		if a == nil {
			return status.Error(codes.InvalidArgument, "after the hello, a box sends only acks")
		}
		if err := s.desired.Ack(ctx, box, a.GetRevision()); err != nil {
			return grpcError(err)
		}
	}
}
