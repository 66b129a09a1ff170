package agentrpc

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestRunEnds: Run serves until its context ends and returns nil then, or
// returns the listener's error when the listener fails first.
func TestRunEnds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		stop    func(cancel context.CancelFunc, l net.Listener)
		wantErr bool
	}{
		{"context ends", func(cancel context.CancelFunc, _ net.Listener) { cancel() }, false},
		{"listener fails", func(_ context.CancelFunc, l net.Listener) { l.Close() }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			s := NewServer(Config{}, l, slog.New(slog.NewTextHandler(io.Discard, nil)))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- s.Run(ctx) }()

			// It serves: a call from outside the tunnel is refused by the
			// service itself.
			cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			callCtx, done := context.WithTimeout(context.Background(), 30*time.Second)
			defer done()
			_, err = edgeboxv1.NewConsoleServiceClient(cc).Renew(callCtx, &edgeboxv1.RenewRequest{})
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("Renew from outside the tunnel: %v, want Unauthenticated", err)
			}

			tt.stop(cancel, l)
			select {
			case err := <-ran:
				if (err != nil) != tt.wantErr {
					t.Fatalf("Run returned %v, want an error: %v", err, tt.wantErr)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run has not returned 30s after the stop")
			}
		})
	}
}
