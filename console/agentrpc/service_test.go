package agentrpc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

// peerListener makes every connection look as if it came over box peer's
// tunnel (peer "" leaves the in-memory address as it is).
type peerListener struct {
	net.Listener
	peer string
}

type peerConn struct {
	net.Conn
	addr net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.addr }

func (l peerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || l.peer == "" {
		return c, err
	}
	return peerConn{c, tunnel.Addr{Peer: l.peer, Kind: tunnel.KindRPC}}, nil
}

// TestConsoleErrorsReachTheAgentWithTheirKind: what the console's
// ConsoleService refuses a box with reaches the agent, over gRPC, as the
// same kind and the same words.
func TestConsoleErrorsReachTheAgentWithTheirKind(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		peer string
		csr  []byte
		kind error
		code codes.Code
		msg  string
	}{
		{"a CSR too long", "b1", make([]byte, 5000), errdefs.ErrInvalid, codes.InvalidArgument, "enroll: bad request: CSR longer than 4096 bytes"},
		{"not a CSR", "b1", []byte("nope"), errdefs.ErrInvalid, codes.InvalidArgument, ""},
		{"not over the tunnel", "", nil, errdefs.ErrPermission, codes.Unauthenticated, "not called over the tunnel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := bufconn.Listen(1 << 16)
			srv := grpc.NewServer()
			edgeboxv1.RegisterConsoleServiceServer(srv, &consoleService{log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			done := make(chan error, 1)
			go func() { done <- srv.Serve(peerListener{l, tt.peer}) }()
			cc, err := grpc.NewClient("passthrough:///console",
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cc.Close()
				srv.Stop()
				if err := <-done; err != nil {
					t.Errorf("serve: %v", err)
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = edgeboxv1.NewConsoleServiceClient(cc).Renew(ctx, &edgeboxv1.RenewRequest{Csr: tt.csr})
			err = errgrpc.ToNative(err)
			if !errors.Is(err, tt.kind) || status.Code(err) != tt.code {
				t.Fatalf("Renew: %v (%v), want kind %v (%v)", err, status.Code(err), tt.kind, tt.code)
			}
			if tt.msg != "" && err.Error() != tt.msg {
				t.Errorf("message %q, want %q", err.Error(), tt.msg)
			}
			if err.Error() == errgrpc.Internal {
				t.Errorf("the agent was told %q, not why", err)
			}
		})
	}
}
