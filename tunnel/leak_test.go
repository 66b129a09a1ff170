package tunnel

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// TestNoGoroutineLeak runs a server and a client through streams,
// reconnects and shutdown, and checks every goroutine they started is gone.
// It is not parallel: it counts the process's goroutines.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	// Cleanups run last-registered first: this one runs after the
	// client's and server's.
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("%d goroutines before, %d after; all goroutines:\n%s", before, n, buf)
		}
	})

	func() {
		p := newTestPKI(t)
		srv := startTestServer(t, p, DefaultConfig(), "")
		echo(t, srv.Listen(KindRPC))
		cli := startTestClient(t, p, "box-1", srv.addr, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for range 20 {
			c, err := cli.Open(ctx, KindRPC, nil)
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, c, "x")
			c.Close()
		}
		srv.Drop("box-1") // a reconnect
		waitFor(t, 5*time.Second, "reconnect", func() bool { _, ok := srv.Session("box-1"); return ok })
		srv.stop()
	}()
}
