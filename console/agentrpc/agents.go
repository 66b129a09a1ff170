package agentrpc

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

// Agents reaches the boxes' AgentService over their tunnel sessions.
type Agents struct{ tunnel *tunnel.Server }

// NewAgents returns the Agents of srv's sessions.
func NewAgents(srv *tunnel.Server) *Agents { return &Agents{tunnel: srv} }

// Conn returns a gRPC connection to a box's AgentService over its
// tunnel. The connection follows the box across reconnects; the caller
// closes it when done.
func (a *Agents) Conn(boxID string) (*grpc.ClientConn, error) {
	srv := a.tunnel
	return grpc.NewClient("passthrough:///"+boxID,
		grpc.WithTransportCredentials(insecure.NewCredentials()), // the tunnel is the mTLS
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return srv.Open(ctx, boxID, tunnel.KindRPC, nil)
		}))
}

// Ping calls a box's AgentService.Ping: a full round trip through the
// tunnel, the agent's gRPC server and back.
func (a *Agents) Ping(ctx context.Context, boxID string, payload []byte) (*edgeboxv1.PingResponse, error) {
	conn, err := a.Conn(boxID)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return edgeboxv1.NewAgentServiceClient(conn).Ping(ctx, &edgeboxv1.PingRequest{Payload: payload})
}

// Logs asks a box's agent for the end of a workload's output.
func (a *Agents) Logs(ctx context.Context, box, workload string, tail uint32) (*edgeboxv1.LogsResponse, error) {
	conn, err := a.Conn(box)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := edgeboxv1.NewAgentServiceClient(conn).Logs(ctx, &edgeboxv1.LogsRequest{Workload: workload, Tail: tail})
	if err == nil {
		return resp, nil
	}
	// The box's own kinds (NotFound, Invalid) carry through; whatever
	// else went wrong, the box could not answer.
	if err = errgrpc.ToNative(err); errdefs.Kind(err) == nil {
		err = errdefs.Wrap(errdefs.ErrUnavailable, err)
	}
	return nil, fmt.Errorf("box %s: %w", box, err)
}

// Wipe asks a box's agent to wipe itself and waits for its answer until
// ctx ends. Without an answer, the error says why in a few words, for the
// box's record: the box is offline, its agent predates wiping, the wait
// ran out (context.DeadlineExceeded), or what went wrong.
func (a *Agents) Wipe(ctx context.Context, box, reason string) (*edgeboxv1.WipeResponse, error) {
	if _, ok := a.tunnel.Session(box); !ok {
		return nil, errdefs.Unavailable("box offline")
	}
	conn, err := a.Conn(box)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := edgeboxv1.NewAgentServiceClient(conn).Wipe(ctx, &edgeboxv1.WipeRequest{Reason: reason})
	if err == nil {
		return resp, nil
	}
	err = errgrpc.ToNative(err)
	switch {
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return nil, fmt.Errorf("%w: %s", context.DeadlineExceeded, err)
	case status.Code(err) == codes.Unimplemented: // an agent from before wiping
		return nil, errdefs.Unavailable("the box's agent is too old to wipe itself")
	case errors.Is(err, errdefs.ErrUnavailable):
		return nil, errdefs.Unavailable("box unreachable: %w", err)
	}
	return nil, errdefs.Unavailable("error: %w", err)
}
