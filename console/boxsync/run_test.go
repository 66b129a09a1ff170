package boxsync

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/store/storetest"
)

// TestRunEnds: Run returns nil when its context ends, and the listener's
// error when the listener fails first.
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
			approved := func(context.Context, string) (bool, error) { return true, nil }
			s := New(Config{Desired: desired.New(storetest.Bolt(t)), Approved: approved, Listener: l, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- s.Run(ctx) }()
			// A stream that is not a box's is closed, and the server
			// serves on.
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("a stream from no box: read %v, want EOF", err)
			}
			c.Close()
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
