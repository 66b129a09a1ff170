package tunnel

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A console too busy to start a box's TLS handshake says so before any
// crypto: instead of its ServerHello it writes earlyBusy, then the
// big-endian u32 milliseconds after which the box may dial again, and
// closes. A TLS record never starts with a zero byte (content types are 20
// to 24), so the box tells the two apart by the first byte it reads.
//
// The answer is not authenticated: someone on the path could send it to
// keep a box away. Someone on the path can cut the connection anyway; the
// wait such an answer may ask for is bounded by MaxEarlyRetryAfter.
const earlyBusy = "\x00edgebox-busy"

// earlyBusyLen is the length of the whole answer.
const earlyBusyLen = len(earlyBusy) + 4

// MaxEarlyRetryAfter bounds the wait an answer before TLS may ask of a box;
// a longer one is read as this.
const MaxEarlyRetryAfter = 2 * time.Minute

// WriteEarlyBusy writes the answer of a console too busy to start a TLS
// handshake: come back after retryAfter. It goes on the raw connection
// before the TLS server has written anything.
func WriteEarlyBusy(w io.Writer, retryAfter time.Duration) error {
	retryAfter = min(max(retryAfter, 0), MaxEarlyRetryAfter)
	b := binary.BigEndian.AppendUint32([]byte(earlyBusy), uint32(retryAfter.Milliseconds()))
	_, err := w.Write(b)
	return err
}

// readEarlyBusy reads the rest of an answer whose first byte was zero and
// returns it as a *BusyError, or the error that makes it unreadable.
func readEarlyBusy(r io.Reader) error {
	var b [earlyBusyLen - 1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("tunnel: reading the console's answer before TLS: %w", err)
	}
	if string(b[:len(earlyBusy)-1]) != earlyBusy[1:] {
		return fmt.Errorf("tunnel: the console's first byte is neither TLS nor edgebox's busy answer")
	}
	after := time.Duration(binary.BigEndian.Uint32(b[len(earlyBusy)-1:])) * time.Millisecond
	return &BusyError{RetryAfter: min(after, MaxEarlyRetryAfter)}
}

// earlyConn is a box's raw connection to the console that notices the
// busy answer: the first read that starts with a zero byte reads the
// answer and fails with its *BusyError, which Busy keeps for the dialer
// (crypto/tls may not pass the error on as it is).
type earlyConn struct {
	net.Conn
	mu      sync.Mutex
	checked bool
	busy    error
	broke   bool // a read or a write failed: the link, not TLS, ended the handshake
}

func (c *earlyConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.checked {
		c.mu.Unlock()
		n, err := c.Conn.Read(p)
		if err != nil {
			c.linkFailed()
		}
		return n, err
	}
	defer c.mu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	n, err := c.Conn.Read(p[:1])
	if n == 0 {
		c.broke = err != nil
		return 0, err
	}
	c.checked = true
	if p[0] != 0 {
		return 1, nil
	}
	c.busy = readEarlyBusy(c.Conn)
	return 0, c.busy
}

// Write marks the link broken when a write fails: a ClientHello that
// could not leave (a connection reset before it was read) says nothing
// against the ticket it carried; TLS refuses a handshake only by what it
// reads.
func (c *earlyConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.linkFailed()
	}
	return n, err
}

// linkFailed records that the link, not TLS, failed the connection.
func (c *earlyConn) linkFailed() {
	c.mu.Lock()
	c.broke = true
	c.mu.Unlock()
}

// keepsTicket reports whether the handshake ended for a reason that says
// nothing against the session ticket it offered: the console's busy
// answer, or a link that failed (a deadline, a reset) rather than a TLS
// alert.
func (c *earlyConn) keepsTicket() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.busy != nil || c.broke
}

// Busy returns the console's busy answer, if that is what it sent.
func (c *earlyConn) Busy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.busy
}
