package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestReadEarlyBusy(t *testing.T) {
	t.Parallel()
	answer := func(d time.Duration) []byte {
		var b bytes.Buffer
		if err := WriteEarlyBusy(&b, d); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	for _, c := range []struct {
		name  string
		in    []byte
		after time.Duration // when busy
		err   string        // else
	}{
		{"busy", answer(1500 * time.Millisecond), 1500 * time.Millisecond, ""},
		{"no wait", answer(0), 0, ""},
		{"too long a wait is written as the bound", answer(time.Hour), MaxEarlyRetryAfter, ""},
		{"too long a wait is read as the bound", append([]byte(earlyBusy), 0xff, 0xff, 0xff, 0xff), MaxEarlyRetryAfter, ""},
		{"truncated", answer(time.Second)[:earlyBusyLen-2], 0, "reading the console's answer"},
		{"wrong magic", append([]byte("\x00edgebox-bus!"), 0, 0, 0, 1), 0, "neither TLS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.in[0] != 0 {
				t.Fatal("an answer starts with a zero byte")
			}
			err := readEarlyBusy(bytes.NewReader(c.in[1:]))
			var busy *BusyError
			if c.err != "" {
				if err == nil || errors.As(err, &busy) || !bytes.Contains([]byte(err.Error()), []byte(c.err)) {
					t.Fatalf("got %v, want an error saying %q", err, c.err)
				}
				return
			}
			if !errors.As(err, &busy) || !errors.Is(err, ErrBusy) {
				t.Fatalf("got %v, want a busy answer", err)
			}
			if busy.RetryAfter != c.after {
				t.Fatalf("retry after %v, want %v", busy.RetryAfter, c.after)
			}
		})
	}
}

func FuzzReadEarlyBusy(f *testing.F) {
	f.Add([]byte(earlyBusy[1:] + "\x00\x00\x05\xdc"))
	f.Add([]byte("edgebox"))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := readEarlyBusy(bytes.NewReader(b))
		var busy *BusyError
		if errors.As(err, &busy) && (busy.RetryAfter < 0 || busy.RetryAfter > MaxEarlyRetryAfter) {
			t.Fatalf("a wait of %v passed the bound", busy.RetryAfter)
		}
		if err == nil {
			t.Fatal("an answer read as no answer")
		}
	})
}

// TestEarlyConnPassesTLSThrough reads what does not start with a zero
// byte unchanged, in reads of any size.
func TestEarlyConnPassesTLSThrough(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	defer a.Close()
	want := []byte("\x16\x03\x03 a TLS record and more")
	go func() { b.Write(want); b.Close() }()
	ec := &earlyConn{Conn: a}
	got, err := io.ReadAll(ec)
	if err != nil || !bytes.Equal(got, want) || ec.Busy() != nil {
		t.Fatalf("read %q, %v (busy %v); want %q", got, err, ec.Busy(), want)
	}
}

// front listens before srv and counts the dials it takes. For each dial n
// (from 1) that answer says it handles, the front reads the ClientHello
// and hands the connection to answer, which ends it; the others it
// splices to srv. It returns its address and the dials' times so far.
func front(t *testing.T, srv *testServer, handles func(n int) bool, answer func(net.Conn)) (string, func() []time.Time) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		dials []time.Time
		wg    sync.WaitGroup
	)
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			dials = append(dials, time.Now())
			n := len(dials)
			mu.Unlock()
			if handles(n) {
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				c.Read(make([]byte, 4096))
				answer(c)
				c.Close()
				continue
			}
			back, err := net.Dial("tcp", srv.addr)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(back, c); back.Close() }()
			go func() { defer wg.Done(); io.Copy(c, back); c.Close() }()
		}
	}()
	return ln.Addr().String(), func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(dials)
	}
}

// dropAndResume waits for cli's first session, makes it healthy with a
// stream round trip (its end is then redialled at once, not after the
// backoff), has srv drop box, and waits for the next one: it reports
// whether that one resumed the first's TLS session.
func dropAndResume(t *testing.T, srv *testServer, cli *Client, box string) bool {
	t.Helper()
	waitFor(t, 10*time.Second, "the first session", func() bool { return cli.Session() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := cli.Open(ctx, KindRPC, nil)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, st, "hello")
	st.Close()
	var resumed atomic.Bool
	cli.addrs[0].tls.VerifyConnection = func(cs tls.ConnectionState) error {
		resumed.Store(cs.DidResume)
		return nil
	}
	first := cli.Session()
	srv.Drop(box)
	waitFor(t, 10*time.Second, "a session after the refused dials", func() bool {
		s := cli.Session()
		return s != nil && s != first
	})
	return resumed.Load()
}

// TestBusyBeforeTLSSaysWhenToComeBack puts a front before the console that
// answers two dials with the busy answer before TLS, as a console's port
// does when it has no room for another handshake. The box's first session
// comes up, then it is dropped: the box comes back after the wait it was
// told each time, not after its own backoff (pinned to 30 s here), and the
// dial after the busy answers resumes the TLS session the first one made.
func TestBusyBeforeTLSSaysWhenToComeBack(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	echo(t, srv.Listen(KindRPC))
	addr, dials := front(t, srv, func(n int) bool { return n == 2 || n == 3 },
		func(c net.Conn) { WriteEarlyBusy(c, 300*time.Millisecond) }) // in place of the ServerHello
	cli := startTestClient(t, p, "box-1", addr, func(c *ClientConfig) {
		c.Backoff = Backoff{Min: 30 * time.Second, Max: 30 * time.Second, Rand: func(n int64) int64 { return n - 1 }}
		c.Rejoin = time.Millisecond
	})
	resumed := dropAndResume(t, srv, cli, "box-1")
	d := dials()
	if len(d) != 4 {
		t.Fatalf("the box dialled %d times, want 4", len(d))
	}
	for i := 2; i < len(d); i++ {
		if gap := d[i].Sub(d[i-1]); gap < 300*time.Millisecond {
			t.Fatalf("dial %d came %v after a busy answer that said 300ms", i+1, gap)
		}
	}
	if !resumed {
		t.Fatal("the dial after the busy answers made a full handshake: the box forgot its session ticket")
	}
}

// TestTicketKeptWhenTheLinkCutsTheHandshake cuts two dials after their
// ClientHello, as a console too busy to answer before the box's deadline
// does: the dial after them still resumes the box's TLS session. A ticket
// is forgotten only when TLS itself refuses the handshake.
func TestTicketKeptWhenTheLinkCutsTheHandshake(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	echo(t, srv.Listen(KindRPC))
	addr, dials := front(t, srv, func(n int) bool { return n == 2 || n == 3 }, func(net.Conn) {})
	cli := startTestClient(t, p, "box-1", addr, func(c *ClientConfig) {
		c.Backoff = Backoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	})
	resumed := dropAndResume(t, srv, cli, "box-1")
	if n := len(dials()); n != 4 {
		t.Fatalf("the box dialled %d times, want 4", n)
	}
	if !resumed {
		t.Fatal("the dial after the cut handshakes made a full handshake: the box forgot its session ticket")
	}
}

// TestTicketKeptWhenTheClientHelloCannotBeSent has the link reset two
// dials before their ClientHello leaves, as a console's port does to a
// connection it sheds before reading it: the write fails, not a read,
// and the dial after them still resumes the box's TLS session.
func TestTicketKeptWhenTheClientHelloCannotBeSent(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	echo(t, srv.Listen(KindRPC))
	var dials, resets atomic.Int32
	cli := startTestClient(t, p, "box-1", srv.addr, func(c *ClientConfig) {
		c.Backoff = Backoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}
		var d net.Dialer
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if n := dials.Add(1); err == nil && (n == 2 || n == 3) {
				resets.Add(1)
				return resetConn{conn}, nil
			}
			return conn, err
		}
	})
	resumed := dropAndResume(t, srv, cli, "box-1")
	if n := resets.Load(); n != 2 {
		t.Fatalf("%d dials were reset, want 2", n)
	}
	if !resumed {
		t.Fatal("the dial after the reset ones made a full handshake: the box forgot its session ticket")
	}
}

// resetConn is a connection the far side reset before anything was
// written to it.
type resetConn struct{ net.Conn }

func (c resetConn) Write([]byte) (int, error) {
	c.Conn.Close()
	return 0, &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
}
