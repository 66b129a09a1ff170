package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// pipeConsole is a console reached over net.Pipe, so that a Client and
// Servers run inside a synctest bubble on its fake clock. It can be
// stopped (boxes then fail to dial, as against a closed port) and started
// again as a new Server, as a restarted console is.
type pipeConsole struct {
	t   *testing.T
	p   *testPKI
	tls *tls.Config

	mu  sync.Mutex // guards srv
	srv *Server    // nil while the console is down
	wg  sync.WaitGroup
}

func newPipeConsole(t *testing.T, p *testPKI) *pipeConsole {
	return &pipeConsole{t: t, p: p, tls: &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.server},
		ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert, NextProtos: []string{ALPN},
	}}
}

func (pc *pipeConsole) start() {
	srv, err := NewServer(ServerConfig{Config: DefaultConfig(), Identify: func(cs tls.ConnectionState) (string, error) {
		return cs.PeerCertificates[0].Subject.CommonName, nil
	}}, testLogger(pc.t), NewMetrics(nil))
	if err != nil {
		pc.t.Fatal(err)
	}
	pc.mu.Lock()
	pc.srv = srv
	pc.mu.Unlock()
}

// stop shuts the console down: with goodbye, as a console does on SIGTERM;
// without, as one that crashed.
func (pc *pipeConsole) stop(goodbye bool) {
	pc.mu.Lock()
	srv := pc.srv
	pc.srv = nil
	pc.mu.Unlock()
	if goodbye {
		srv.Close()
		return
	}
	for _, s := range srv.Sessions() {
		s.Close()
	}
}

func (pc *pipeConsole) dial(_ context.Context, _, _ string) (net.Conn, error) {
	pc.mu.Lock()
	srv := pc.srv
	pc.mu.Unlock()
	if srv == nil {
		return nil, errors.New("connection refused")
	}
	b, c := net.Pipe()
	box, console := newBufConn(b), newBufConn(c)
	pc.wg.Add(1)
	go func() {
		defer pc.wg.Done()
		tc := tls.Server(console, pc.tls)
		if err := tc.HandshakeContext(context.Background()); err != nil {
			console.Close()
			return
		}
		srv.ServeConn(context.Background(), tc)
	}()
	return box, nil
}

// bufConn gives one end of a net.Pipe a send buffer, as a socket has: its
// writes return at once and a goroutine of its own delivers them. Without
// it, both sides of a TLS 1.3 handshake can be writing at once, and a
// net.Pipe, which has no buffer, deadlocks.
type bufConn struct {
	net.Conn
	out       chan []byte
	closed    chan struct{}
	closeOnce sync.Once
}

func newBufConn(c net.Conn) *bufConn {
	b := &bufConn{Conn: c, out: make(chan []byte, 1024), closed: make(chan struct{})}
	go b.pump()
	return b
}

// pump delivers what was written until the conn is closed.
func (b *bufConn) pump() {
	for {
		select {
		case p := <-b.out:
			if _, err := b.Conn.Write(p); err != nil {
				return
			}
		case <-b.closed:
			return
		}
	}
}

func (b *bufConn) Write(p []byte) (int, error) {
	select {
	case b.out <- bytes.Clone(p):
		return len(p), nil
	case <-b.closed:
		return 0, net.ErrClosed
	}
}

func (b *bufConn) Close() error {
	b.closeOnce.Do(func() { close(b.closed); b.Conn.Close() })
	return nil
}

// TestRunRedialsOnTheFakeClock runs a Client against consoles that restart
// three times, 10 s apart and each down for 3 s, on synctest's fake clock.
// Random waits are drawn at the top of their window, or at a third of it
// (so that a redial finds the console still down and backs off). After a
// goodbye, or after a healthy session the console crashed under, the box
// must be back within the rejoin window (5 s) of the console's return.
//
// Each case runs in a child process (fakeClockHelper): yamux keeps timers
// in a process-wide pool, and a timer made inside a synctest bubble must
// never reach another test's goroutines.
func TestRunRedialsOnTheFakeClock(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"goodbye/top", "goodbye/third", "crash/top", "crash/third", "advised"} {
		t.Run(c, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestFakeClockHelper$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "EDGEBOX_FAKE_CLOCK_CASE="+c)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- PASS: TestFakeClockHelper") {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, "came back") {
					t.Log(strings.TrimSpace(line))
				}
			}
		})
	}
}

// TestFakeClockHelper is TestRunRedialsOnTheFakeClock's child process; run
// on its own it does nothing.
func TestFakeClockHelper(t *testing.T) {
	c := os.Getenv("EDGEBOX_FAKE_CLOCK_CASE")
	if c == "" {
		return
	}
	if c == "advised" {
		synctest.Test(t, fakeClockAdvised)
		return
	}
	how, draw, _ := strings.Cut(c, "/")
	goodbye := how == "goodbye"
	rnd := func(n int64) int64 { return n - 1 }
	if draw == "third" {
		rnd = func(n int64) int64 { return n / 3 }
	}
	synctest.Test(t, func(t *testing.T) { fakeClockRestarts(t, goodbye, rnd) })
}

// fakeClockBox is a Client running against a pipeConsole in a synctest
// bubble, with when its sessions came up.
type fakeClockBox struct {
	cli    *Client
	pc     *pipeConsole
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	ups    []time.Time
}

// startFakeClockBox starts a console and a box that draws its random
// waits with rnd, and waits for the first session.
func startFakeClockBox(t *testing.T, rnd func(int64) int64) (*fakeClockBox, context.Context) {
	p := newTestPKI(t)
	b := &fakeClockBox{pc: newPipeConsole(t, p), done: make(chan struct{})}
	b.pc.start()
	cert := p.leaf(t, "box-1", x509.ExtKeyUsageClientAuth)
	var err error
	b.cli, err = NewClient(ClientConfig{
		Config: DefaultConfig(), Addr: "console:8443", Dial: b.pc.dial,
		TLS:     &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"},
		Proxy:   func(*url.URL) (*url.URL, error) { return nil, nil },
		Backoff: Backoff{Min: time.Second, Max: time.Minute, Rand: rnd},
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	b.cli.OnSession = func(_ *Session, up bool) {
		if up {
			b.mu.Lock()
			b.ups = append(b.ups, time.Now())
			b.mu.Unlock()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	go func() { defer close(b.done); b.cli.Run(ctx) }()
	synctest.Wait()
	if b.cli.Session() == nil {
		t.Fatal("no first session")
	}
	return b, ctx
}

func (b *fakeClockBox) lastUp() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ups[len(b.ups)-1]
}

// stop ends the box, then the console.
func (b *fakeClockBox) stop() {
	b.cancel()
	<-b.done
	b.pc.stop(false)
	b.pc.wg.Wait()
}

func fakeClockRestarts(t *testing.T, goodbye bool, rnd func(int64) int64) {
	b, ctx := startFakeClockBox(t, rnd)
	cli, pc, lastUp := b.cli, b.pc, b.lastUp
	// After a crash only health speeds the box up: each session is made
	// healthy, as the agent's hello makes it. A console saying goodbye
	// needs none: its sessions carry nothing (and last under the 10 s
	// ping interval, so no ping makes them healthy either).
	healthy := func() {
		if goodbye {
			return
		}
		pc.mu.Lock()
		pc.srv.Listen(KindRPC)
		pc.mu.Unlock()
		if _, err := cli.Open(ctx, KindRPC, nil); err != nil {
			t.Fatal(err)
		}
	}
	healthy()
	for i := range 3 {
		start := time.Now()
		pc.stop(goodbye)
		time.Sleep(3 * time.Second)
		pc.start()
		back := time.Now()
		// The next restart comes 10 s after this one began.
		time.Sleep(10*time.Second - time.Since(start))
		synctest.Wait()
		up := lastUp()
		if up.Before(back) {
			t.Fatalf("restart %d: the box is not back 10 s after the console went down", i+1)
		}
		if took := up.Sub(back); took > DefaultRejoin {
			t.Fatalf("restart %d: the box came back %v after the console, want at most %v", i+1, took, DefaultRejoin)
		} else {
			t.Logf("restart %d: the box came back %v after the console", i+1, took)
		}
		healthy()
	}
	b.stop()
}

// fakeClockAdvised: a box whose console advised a 20 s rejoin window
// comes back within it after a goodbye, not within its own 5 s: drawn at
// the top, 20 s after the console went.
func fakeClockAdvised(t *testing.T) {
	b, _ := startFakeClockBox(t, func(n int64) int64 { return n - 1 })
	b.cli.AdviseRejoin(20 * time.Second)
	start := time.Now()
	b.pc.stop(true)
	time.Sleep(3 * time.Second)
	b.pc.start()
	time.Sleep(25 * time.Second)
	synctest.Wait()
	if took := b.lastUp().Sub(start); took < 20*time.Second || took > 21*time.Second {
		t.Fatalf("the box came back %v after the goodbye, want 20 s, the window advised", took)
	} else {
		t.Logf("the box came back %v after the goodbye, advised 20 s", took)
	}
	b.stop()
}
