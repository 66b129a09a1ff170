package tunnel

import (
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync"
)

// corkConn is the TCP connection under a tunnel's TLS. While corked it
// gathers what TLS writes and sends it with one system call when uncorked.
//
// Why (docs/benchmarks.md, BenchmarkThroughput): yamux writes each frame as
// a header and a body; TLS turns a 12-byte header and a 32 KiB body into
// three records and three system calls, where raw TLS needs two for the same
// 32 KiB. System calls were half of the tunnel's CPU time. Corking across
// one frame sends its three records in one write.
//
// Order is kept: TLS creates records and writes them to this conn under its
// own output lock, and mu serialises every write to the socket, so records
// leave in the order TLS made them, whoever made them.
type corkConn struct {
	net.Conn
	mu     sync.Mutex // guards corked and buf; held across socket writes
	corked bool
	buf    *[]byte // pooled while corked
}

// corkMax is the largest frame body sent corked; past it the extra record
// of the header no longer matters, and copying the frame would.
const corkMax = 64 << 10

// corkPool holds buffers that fit a corked frame: the body, its header's
// record and each record's 22 bytes of framing and tag.
var corkPool = sync.Pool{New: func() any { b := make([]byte, 0, corkMax+4<<10); return &b }}

// CorkConn wraps a TCP connection that will carry a tunnel session, so the
// session can send each frame with one system call. Both Client and the
// console's listener use it; a session over an unwrapped connection works
// too, only slower.
func CorkConn(c net.Conn) net.Conn { return &corkConn{Conn: c} }

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		*c.buf = append(*c.buf, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.buf = corkPool.Get().(*[]byte)
	c.mu.Unlock()
}

func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	b := c.buf
	c.buf = nil
	_, err := c.Conn.Write(*b)
	*b = (*b)[:0]
	corkPool.Put(b)
	return err
}

// frameWriter sits between yamux and TLS. When yamux writes the header of
// a data frame of at most corkMax bytes, it corks the connection under TLS;
// when yamux then writes the body (its send loop is one goroutine, so the
// next write is the body), it uncorks, and the frame leaves in one system
// call.
type frameWriter struct {
	*tls.Conn
	cork    *corkConn
	pending bool
}

const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
)

// yamuxConn returns what yamux should write to: conn itself, or a
// frameWriter when conn runs over a CorkConn.
func yamuxConn(conn *tls.Conn) net.Conn {
	if cc, ok := conn.NetConn().(*corkConn); ok {
		return &frameWriter{Conn: conn, cork: cc}
	}
	return conn
}

func (w *frameWriter) Write(p []byte) (int, error) {
	if w.pending {
		w.pending = false
		n, err := w.Conn.Write(p)
		if uerr := w.cork.uncork(); err == nil {
			err = uerr
		}
		return n, err
	}
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData {
		if n := binary.BigEndian.Uint32(p[8:]); n == 0 || n > corkMax {
			return w.Conn.Write(p)
		}
		w.cork.cork()
		n, err := w.Conn.Write(p)
		if err != nil {
			w.cork.uncork()
			return n, err
		}
		w.pending = true
		return n, nil
	}
	return w.Conn.Write(p)
}
