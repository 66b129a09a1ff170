package agent

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// downDriver is a runtime whose daemon does not answer.
type downDriver struct{ *fake.Driver }

func (downDriver) Inspect(context.Context, string) (runtime.Instance, error) {
	return runtime.Instance{}, errors.New("dial unix /run/containerd/containerd.sock: connect: connection refused")
}

// serveAgent serves the agent's AgentService on a real gRPC server and
// returns a client of it, as the console holds one over the tunnel.
func serveAgent(t *testing.T, s *agentService) edgeboxv1.AgentServiceClient {
	t.Helper()
	l := bufconn.Listen(1 << 16)
	srv := grpc.NewServer()
	edgeboxv1.RegisterAgentServiceServer(srv, s)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	cc, err := grpc.NewClient("passthrough:///box",
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
	return edgeboxv1.NewAgentServiceClient(cc)
}

// TestAgentErrorsReachTheConsoleWithTheirKind: what the agent's Logs and
// Wipe refuse with reaches the caller, over gRPC, as the same kind and the
// same words.
func TestAgentErrorsReachTheConsoleWithTheirKind(t *testing.T) {
	t.Parallel()
	up := fake.New("fake")
	if err := up.Create(context.Background(), runtime.Spec{Name: "web", Workload: &edgeboxv1.Workload{}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		drivers  []runtime.Driver
		workload string
		kind     error
		code     codes.Code
		msg      string
	}{
		{"invalid name", []runtime.Driver{up}, "Not A Name", errdefs.ErrInvalid, codes.InvalidArgument, `workload name "Not A Name" is not valid`},
		{"no such workload", []runtime.Driver{up}, "db", errdefs.ErrNotFound, codes.NotFound, `no workload "db" runs on this box`},
		{"runtime down", []runtime.Driver{downDriver{fake.New("containerd")}}, "web", errdefs.ErrUnavailable, codes.Unavailable,
			"containerd: dial unix /run/containerd/containerd.sock: connect: connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := serveAgent(t, &agentService{drivers: tt.drivers})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := c.Logs(ctx, &edgeboxv1.LogsRequest{Workload: tt.workload})
			err = errgrpc.ToNative(err)
			if !errors.Is(err, tt.kind) || status.Code(err) != tt.code {
				t.Fatalf("Logs: %v (%v), want kind %v (%v)", err, status.Code(err), tt.kind, tt.code)
			}
			if err.Error() != tt.msg {
				t.Errorf("message %q, want %q", err.Error(), tt.msg)
			}
		})
	}
	t.Run("logs of a running workload", func(t *testing.T) {
		t.Parallel()
		c := serveAgent(t, &agentService{drivers: []runtime.Driver{up}})
		resp, err := c.Logs(context.Background(), &edgeboxv1.LogsRequest{Workload: "web"})
		if err != nil || len(resp.GetText()) == 0 {
			t.Fatalf("Logs = %q, %v", resp.GetText(), err)
		}
	})
	t.Run("an agent that cannot wipe", func(t *testing.T) {
		t.Parallel()
		c := serveAgent(t, &agentService{})
		_, err := c.Wipe(context.Background(), &edgeboxv1.WipeRequest{})
		if err = errgrpc.ToNative(err); status.Code(err) != codes.Unimplemented || err.Error() != "this agent cannot wipe its box" {
			t.Errorf("Wipe: %v (%v)", err, status.Code(err))
		}
	})
}
