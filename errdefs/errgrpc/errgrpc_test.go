package errgrpc_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// failing answers every call of both services with err, through ToGRPC,
// as the console's and the agent's handlers do.
type failing struct {
	edgeboxv1.UnimplementedConsoleServiceServer
	edgeboxv1.UnimplementedAgentServiceServer
	err error
}

func (f failing) Hello(context.Context, *edgeboxv1.HelloRequest) (*edgeboxv1.HelloResponse, error) {
	return nil, errgrpc.ToGRPC(f.err)
}

func (f failing) Logs(context.Context, *edgeboxv1.LogsRequest) (*edgeboxv1.LogsResponse, error) {
	return nil, errgrpc.ToGRPC(f.err)
}

// dial serves srv on a real gRPC server over an in-memory listener and
// returns a client connection to it.
func dial(t *testing.T, srv failing) *grpc.ClientConn {
	t.Helper()
	l := bufconn.Listen(1 << 16)
	s := grpc.NewServer()
	edgeboxv1.RegisterConsoleServiceServer(s, srv)
	edgeboxv1.RegisterAgentServiceServer(s, srv)
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	cc, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return cc
}

type cause struct{ path string }

func (c *cause) Error() string { return "cause at " + c.path }

// TestKindsSurviveGRPC sends each kind both ways, from the agent's
// AgentService to the console (Logs) and from the console's ConsoleService
// to the agent (Hello), over a real gRPC server and client: the caller
// finds the kind with errors.Is and reads the operator's message as it was.
func TestKindsSurviveGRPC(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		kind error
		code codes.Code
		msg  string
	}{
		{"not found", errdefs.NotFound("no workload %q runs on this box", "web"), errdefs.ErrNotFound, codes.NotFound, `no workload "web" runs on this box`},
		{"conflict", errdefs.Conflict("box b1 is revoked"), errdefs.ErrConflict, codes.FailedPrecondition, "box b1 is revoked"},
		{"invalid", errdefs.Invalid("workload name %q is not valid", "A B"), errdefs.ErrInvalid, codes.InvalidArgument, `workload name "A B" is not valid`},
		{"unavailable", errdefs.Unavailable("containerd: %w", os.ErrDeadlineExceeded), errdefs.ErrUnavailable, codes.Unavailable, "containerd: i/o timeout"},
		{"permission", errdefs.Permission("this box is revoked"), errdefs.ErrPermission, codes.PermissionDenied, "this box is revoked"},
		{"wrapped", errdefs.Wrap(errdefs.ErrConflict, &cause{"/x"}), errdefs.ErrConflict, codes.FailedPrecondition, "cause at /x"},
		{"kind deep in a chain", errors.Join(errors.New("first"), errdefs.NotFound("second")), errdefs.ErrNotFound, codes.NotFound, "first\nsecond"},
		{"enroll's bad request", enroll.ErrBadRequest, errdefs.ErrInvalid, codes.InvalidArgument, enroll.ErrBadRequest.Error()},
		{"enroll's bad token", enroll.ErrBadToken, errdefs.ErrInvalid, codes.InvalidArgument, enroll.ErrBadToken.Error()},
		{"deadline", context.DeadlineExceeded, context.DeadlineExceeded, codes.DeadlineExceeded, "context deadline exceeded"},
		{"a status goes as it is", status.Error(codes.Unimplemented, "this agent cannot wipe its box"), nil, codes.Unimplemented, "this agent cannot wipe its box"},
		{"internal cause stays home", errors.New("open /var/lib/edgebox/secret: permission denied"), nil, codes.Internal, errgrpc.Internal},
	}
	directions := []struct {
		name string
		call func(context.Context, *grpc.ClientConn) error
	}{
		{"agent to console", func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := edgeboxv1.NewAgentServiceClient(cc).Logs(ctx, &edgeboxv1.LogsRequest{Workload: "web"})
			return err
		}},
		{"console to agent", func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := edgeboxv1.NewConsoleServiceClient(cc).Hello(ctx, &edgeboxv1.HelloRequest{})
			return err
		}},
	}
	for _, tt := range tests {
		for _, d := range directions {
			t.Run(tt.name+"/"+d.name, func(t *testing.T) {
				t.Parallel()
				cc := dial(t, failing{err: tt.err})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				err := errgrpc.ToNative(d.call(ctx, cc))
				if err == nil {
					t.Fatal("the call succeeded")
				}
				if got := status.Code(err); got != tt.code {
					t.Errorf("code %v, want %v", got, tt.code)
				}
				if tt.kind != nil && !errors.Is(err, tt.kind) {
					t.Errorf("errors.Is(%v, %v) = false", err, tt.kind)
				}
				if got := errdefs.Kind(err); tt.kind != nil && got != tt.kind && tt.kind != context.DeadlineExceeded {
					t.Errorf("Kind = %v, want %v", got, tt.kind)
				}
				for _, other := range errdefs.Kinds {
					if other != tt.kind && errors.Is(err, other) {
						t.Errorf("errors.Is(%v, %v) = true; it is of kind %v", err, other, tt.kind)
					}
				}
				if err.Error() != tt.msg {
					t.Errorf("message %q, want %q", err.Error(), tt.msg)
				}
				// What ToNative returns goes on unchanged through another hop,
				// as when the console passes on what a box said.
				if again := errgrpc.ToNative(errgrpc.ToGRPC(err)); again.Error() != tt.msg || status.Code(again) != tt.code {
					t.Errorf("second hop: %v (%v), want %q (%v)", again, status.Code(again), tt.msg, tt.code)
				}
			})
		}
	}
}

func TestToNativeLeavesOtherErrors(t *testing.T) {
	t.Parallel()
	for _, err := range []error{nil, errors.New("plain"), errdefs.NotFound("x")} {
		if got := errgrpc.ToNative(err); got != err {
			t.Errorf("ToNative(%v) = %v, want it unchanged", err, got)
		}
	}
	if errgrpc.ToGRPC(nil) != nil {
		t.Error("ToGRPC(nil) is not nil")
	}
}
