package tunnel

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
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

// TestBusyBeforeTLSSaysWhenToComeBack puts a front before the console that
// answers the first two dials with the busy answer before TLS, as a
// console's port does when it has no room for another handshake: the box
// comes back after the wait it was told each time, not after its own
// backoff (pinned to 30 s here), and the third dial brings the session up.
func TestBusyBeforeTLSSaysWhenToComeBack(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	echo(t, srv.Listen(KindRPC))
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		dials []time.Time
		wg    sync.WaitGroup
	)
	t.Cleanup(func() { front.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := front.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			dials = append(dials, time.Now())
			n := len(dials)
			mu.Unlock()
			if n <= 2 {
				// The ClientHello arrives; the answer replaces the
				// ServerHello.
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				c.Read(make([]byte, 4096))
				WriteEarlyBusy(c, 300*time.Millisecond)
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
	cli := startTestClient(t, p, "box-1", front.Addr().String(), func(c *ClientConfig) {
		c.Backoff = Backoff{Min: 30 * time.Second, Max: 30 * time.Second, Rand: func(n int64) int64 { return n - 1 }}
	})
	waitFor(t, 10*time.Second, "a session after two busy answers", func() bool { _, ok := srv.Session("box-1"); return ok })
	waitFor(t, 10*time.Second, "the box's side of the session", func() bool { return cli.Session() != nil })
	mu.Lock()
	defer mu.Unlock()
	if len(dials) != 3 {
		t.Fatalf("the box dialled %d times, want 3", len(dials))
	}
	for i := 1; i < len(dials); i++ {
		if gap := dials[i].Sub(dials[i-1]); gap < 300*time.Millisecond {
			t.Fatalf("dial %d came %v after a busy answer that said 300ms", i+1, gap)
		}
	}
}
