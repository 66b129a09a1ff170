package tunnel

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// Conn is one tunnel stream. It is an ordinary net.Conn whose RemoteAddr is
// an Addr; Header says what the opener asked for. The multiplexer that
// carries it stays inside this package: callers see only the methods below.
type Conn struct {
	st       *yamux.Stream
	session  *Session
	header   Header
	local    Addr
	remote   Addr
	pins     bool        // counted in session.pinned while open
	released atomic.Bool // the pin was given back

	// Read side; one reader at a time, as for any net.Conn.
	bulk    bool    // a full read of bulkRead or more was seen
	gulp    *[]byte // pooled buffer behind pending, or nil
	pending []byte  // read from the stream, not yet returned
}

var _ net.Conn = (*Conn)(nil)

// Header returns the header the stream was opened with.
func (c *Conn) Header() Header { return c.header }

// Kind returns the kind the stream was opened with.
func (c *Conn) Kind() Kind { return c.header.Kind }

// Peer returns the identity of the far side, as verified by TLS.
func (c *Conn) Peer() string { return c.remote.Peer }

// Session returns the session the stream belongs to.
func (c *Conn) Session() *Session { return c.session }

// CloseWrite ends our direction of the stream (the far side reads EOF)
// while reads go on. The stream is freed once both sides closed it, or
// after a timeout.
func (c *Conn) CloseWrite() error { return c.st.Close() }

// Abort ends the stream at once in both directions: reads and writes
// waiting on it return. Close alone ends only our direction, and a read
// waits on until the far side closes its own.
func (c *Conn) Abort() error {
	c.SetDeadline(time.Unix(1, 0))
	return c.Close()
}

// Close ends our direction of the stream and gives it up: we read no more.
func (c *Conn) Close() error {
	if c.pins && !c.released.Swap(true) {
		c.session.pinned.Add(-1)
	}
	c.session.untrack(c.st)
	return c.st.Close()
}

// ReleaseReadBuffer gives back the memory the stream holds for received
// data, if none is waiting to be read. Call it on a stream that will sit
// idle for long (a box's sync stream after its hello): reads still work
// afterwards and take memory again as data arrives. It is safe to call
// while other goroutines read or write.
func (c *Conn) ReleaseReadBuffer() { c.st.Shrink() }

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets the read and write deadlines, as for any net.Conn.
func (c *Conn) SetDeadline(t time.Time) error { return c.session.setDeadline(c.st.SetDeadline, t) }

// SetReadDeadline sets the read deadline, as for any net.Conn.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.session.setDeadline(c.st.SetReadDeadline, t)
}

// SetWriteDeadline sets the write deadline, as for any net.Conn.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	return c.session.setDeadline(c.st.SetWriteDeadline, t)
}

// Read drains a busy stream's receive buffer in large gulps. yamux keeps
// received data in a bytes.Buffer that it fills while the reader empties
// it; small reads leave it partly full, and it then slides or reallocates
// (and clears) its memory over and over. Once a read of 16 KiB or more
// comes back full (a bulk transfer), reads go through a pooled 256 KiB
// buffer so yamux's can empty and reset; the pooled buffer goes back as
// soon as it is drained. Streams of small messages (gRPC on an idle box)
// never take one.
func (c *Conn) Read(b []byte) (int, error) {
	if len(c.pending) == 0 && c.bulk && len(b) < readGulp {
		buf := gulpPool.Get().(*[]byte)
		n, err := c.st.Read(*buf)
		if n == 0 {
			gulpPool.Put(buf)
			return 0, err
		}
		c.gulp, c.pending = buf, (*buf)[:n]
		c.session.count(n, 0)
	}
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			gulpPool.Put(c.gulp)
			c.gulp = nil
		}
		return n, nil
	}
	n, err := c.st.Read(b)
	c.session.count(n, 0)
	if n >= bulkRead && n == len(b) {
		c.bulk = true
	}
	return n, err
}

// bulkRead is the size of a full read that marks a stream as bulk.
const bulkRead = 16 << 10

const readGulp = 256 << 10

var gulpPool = sync.Pool{New: func() any { b := make([]byte, readGulp); return &b }}

func (c *Conn) Write(b []byte) (int, error) {
	n, err := c.st.Write(b)
	c.session.count(0, n)
	return n, err
}
