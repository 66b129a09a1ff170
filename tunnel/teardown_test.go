package tunnel

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// slowClose is a connection whose Close takes hold before it returns, as a
// TLS close_notify into a full send buffer can (crypto/tls gives it 5 s).
type slowClose struct {
	net.Conn
	hold   time.Duration
	closed chan struct{} // closed when Close returns
	once   sync.Once
}

func (c *slowClose) Close() error {
	time.Sleep(c.hold)
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// cpuTime is the CPU time, user and system, this process has used.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestStreamsEndWhenTheLinkDies: when a session's link dies, the reads
// waiting on its streams end at once, though closing the connection takes
// seconds. yamux alone leaves each of them spinning a core until its own
// Close has closed the connection; a box that lost its console burnt its
// CPU so, stream by stream, while it should have been redialling. Not
// parallel: it measures the process's CPU time.
func TestStreamsEndWhenTheLinkDies(t *testing.T) {
	const readers = 8
	cfg := DefaultConfig()
	boxEnd, farEnd := net.Pipe()
	link := &slowClose{Conn: boxEnd, hold: 5 * time.Second, closed: make(chan struct{})}
	ys, err := yamux.Client(link, cfg.yamux())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sess := newSession(ys, "box", "console", cfg, &listeners{self: "box", backlog: cfg.ListenBacklog}, log, NewMetrics(nil))
	sess.start()
	t.Cleanup(func() { sess.Close() })

	// The far side takes every stream and says yes, then sends nothing.
	far, err := yamux.Server(farEnd, cfg.yamux())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			st, err := far.AcceptStream()
			if err != nil {
				return
			}
			go func() {
				if _, err := ReadHeader(st); err == nil {
					writeVerdict(st, "")
				}
			}()
		}
	}()

	ended := make(chan error, readers)
	for range readers {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := sess.Open(ctx, KindRPC, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := c.Read(make([]byte, 1))
			ended <- err
		}()
	}

	cpu0, cut := cpuTime(t), time.Now()
	far.Close() // the link dies: the box reads its end
	for range readers {
		if err := <-ended; err == nil {
			t.Fatal("a read on a dead link returned no error")
		}
	}
	took, cpu := time.Since(cut), cpuTime(t)-cpu0
	select {
	case <-link.closed:
		t.Fatalf("the reads ended only once the connection was closed, %v after the link died", took.Round(time.Millisecond))
	default:
	}
	t.Logf("%d reads ended %v after the link died, using %v of CPU", readers, took.Round(time.Millisecond), cpu.Round(time.Millisecond))
	// Spinning, the readers use a core each (two here) for the 5 s the
	// connection takes to close; at rest, close to nothing.
	if cpu > time.Second {
		t.Fatalf("the session used %v of CPU while its connection closed", cpu.Round(time.Millisecond))
	}
}

// TestClosedSessionStartsNothing: a session closed before it started (a
// console closing as a box arrives) starts no accept loop and arms no
// ping, and Close and start racing each other leave the race detector
// nothing to report.
func TestClosedSessionStartsNothing(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	newSess := func() *Session {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		ys, err := yamux.Client(a, cfg.yamux())
		if err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
		return newSession(ys, "console", "box", cfg, &listeners{self: "console", backlog: cfg.ListenBacklog}, log, NewMetrics(nil))
	}
	sess := newSess()
	sess.Close()
	sess.start()
	sess.mu.Lock()
	armed := sess.pingTimer != nil
	sess.mu.Unlock()
	if armed {
		t.Fatal("a session closed before it started armed its ping timer")
	}
	for range 50 {
		sess := newSess()
		done := make(chan struct{})
		go func() { defer close(done); sess.start() }()
		sess.Close()
		<-done
		sess.Close() // waits for whatever start began
	}
}
