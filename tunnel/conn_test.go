package tunnel

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"testing"
	"time"
)

// connPair opens a stream of kind from the box to the console and returns
// both ends: what the box's Open returned and what the console accepted.
func connPair(t *testing.T, kind Kind, meta map[string]string) (box, console *Conn) {
	t.Helper()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	cli := startTestClient(t, p, "box-1", srv.addr, nil)
	l := srv.Listen(kind)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitFor(t, 10*time.Second, "session", func() bool { _, ok := srv.Session("box-1"); return ok })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	up, err := cli.Open(ctx, kind, meta)
	if err != nil {
		t.Fatalf("box opens %s: %v", kind, err)
	}
	var down net.Conn
	select {
	case c, ok := <-accepted:
		if !ok {
			t.Fatal("console's listener closed before accepting")
		}
		down = c
	case <-ctx.Done():
		t.Fatal("console accepted no stream")
	}
	t.Cleanup(func() { up.Close(); down.Close() })
	return up.(*Conn), down.(*Conn)
}

// readBufferHeld reports whether the multiplexer holds a receive buffer for
// the stream. It looks inside yamux, which only this package may do.
func readBufferHeld(c *Conn) bool {
	return !reflect.ValueOf(c.st).Elem().FieldByName("recvBuf").IsNil()
}

// TestConnIsAPlainStream checks what callers of a tunnel stream rely on,
// through Conn's own methods only.
func TestConnIsAPlainStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		run  func(t *testing.T, box, console *Conn)
	}{
		{"names its kind, header, peer and session", func(t *testing.T, box, console *Conn) {
			if box.Kind() != KindForward || console.Kind() != KindForward {
				t.Errorf("kinds: box %q, console %q, want %q", box.Kind(), console.Kind(), KindForward)
			}
			if got := console.Header().Meta["target"]; got != "127.0.0.1:22" {
				t.Errorf("console's header target = %q, want the opener's", got)
			}
			if console.Peer() != "box-1" || box.Peer() != "console" {
				t.Errorf("peers: console sees %q, box sees %q", console.Peer(), box.Peer())
			}
			if got := console.RemoteAddr().(Addr); got != (Addr{Peer: "box-1", Kind: KindForward}) {
				t.Errorf("console's RemoteAddr = %v", got)
			}
			if console.Session() == nil || console.Session().Peer() != "box-1" {
				t.Errorf("console's stream is not on box-1's session")
			}
		}},
		{"CloseWrite ends one direction, reads go on", func(t *testing.T, box, console *Conn) {
			if _, err := box.Write([]byte("ask")); err != nil {
				t.Fatal(err)
			}
			if err := box.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(console)
			if err != nil || string(got) != "ask" {
				t.Fatalf("console read %q, %v; want \"ask\" then EOF", got, err)
			}
			if _, err := console.Write([]byte("answer")); err != nil {
				t.Fatal(err)
			}
			console.CloseWrite()
			got, err = io.ReadAll(box)
			if err != nil || string(got) != "answer" {
				t.Fatalf("box read %q, %v after its CloseWrite; want \"answer\"", got, err)
			}
		}},
		{"Abort ends a waiting read", func(t *testing.T, box, console *Conn) {
			done := make(chan error, 1)
			go func() { _, err := console.Read(make([]byte, 1)); done <- err }()
			time.Sleep(20 * time.Millisecond) // let the read start waiting; it must end either way
			if err := console.Abort(); err != nil {
				t.Fatalf("Abort: %v", err)
			}
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("read after Abort returned no error")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("read still waiting 10s after Abort")
			}
		}},
		{"deadlines stop reads", func(t *testing.T, box, console *Conn) {
			console.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			_, err := console.Read(make([]byte, 1))
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("read past its deadline: %v, want a timeout", err)
			}
		}},
		{"ReleaseReadBuffer frees the receive buffer, and reads go on", func(t *testing.T, box, console *Conn) {
			if _, err := box.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(console, make([]byte, 5)); err != nil {
				t.Fatal(err)
			}
			if !readBufferHeld(console) {
				t.Fatal("no receive buffer after a read: the check below proves nothing")
			}
			console.ReleaseReadBuffer()
			if readBufferHeld(console) {
				t.Fatal("receive buffer still held after ReleaseReadBuffer")
			}
			want := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, bulk reads
			go func() { box.Write(want); box.CloseWrite() }()
			got, err := io.ReadAll(console)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes, %v after ReleaseReadBuffer; want %d intact", len(got), err, len(want))
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			box, console := connPair(t, KindForward, map[string]string{"target": "127.0.0.1:22"})
			tc.run(t, box, console)
		})
	}
}
