package tunnel

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"
)

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int32
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func dataHeader(n uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[0], h[1] = 0, yamuxTypeData
	binary.BigEndian.PutUint32(h[4:], 1)
	binary.BigEndian.PutUint32(h[8:], n)
	return h
}

func TestFrameWriterSendsSmallFramesInOneWrite(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	a, b := net.Pipe()
	counted := &countingConn{Conn: a}
	client := tls.Client(CorkConn(counted), &tls.Config{RootCAs: p.pool, ServerName: "127.0.0.1"})
	server := tls.Server(b, &tls.Config{Certificates: []tls.Certificate{p.server}})
	go server.Handshake()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	got := make(chan int64)
	go func() { n, _ := io.Copy(io.Discard, server); got <- n }()
	w := yamuxConn(client)

	cases := []struct {
		name       string
		body       int
		wantWrites int32
	}{
		{"32 KiB frame, corked", 32 << 10, 1},
		{"window update, passes through", -1, 1},
		{"200 KiB frame, not corked", 200 << 10, 14}, // a header record, then 13 records of up to 16 KiB
	}
	var total int64
	for _, tc := range cases {
		before := counted.writes.Load()
		if tc.body < 0 {
			h := dataHeader(0)
			h[1] = 1 // window update
			w.Write(h)
			total += int64(len(h))
		} else {
			w.Write(dataHeader(uint32(tc.body)))
			w.Write(make([]byte, tc.body))
			total += int64(yamuxHeaderSize + tc.body)
		}
		n := counted.writes.Load() - before
		if tc.wantWrites == 1 && n != 1 || tc.wantWrites > 1 && n < tc.wantWrites {
			t.Errorf("%s: %d socket writes, want %d", tc.name, n, tc.wantWrites)
		}
	}
	client.Close()
	if n := <-got; n != total {
		t.Fatalf("server read %d bytes, want %d: records lost or out of order", n, total)
	}
}
