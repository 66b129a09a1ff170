// Package forwarding carries the bytes of port forwards and VM screens
// through the tunnel: a stream's target, the box's one reply before any
// data, joining two connections, and the multiplexer an operator's port
// forward runs on its WebSocket. The CLI uses it without the tunnel's
// machinery.
package forwarding

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
)

// A forward stream (tunnel.KindForward) names its TCP target in its header's
// MetaTarget, "host:port". The box dials it and answers with one reply
// before any data: a byte 0 for connected, or a byte 1, a u16 length and
// that many bytes of why not (at most MaxReason). Then the stream
// carries the connection's bytes both ways.

// MetaTarget is the header metadata key naming a forward's target.
const MetaTarget = "target"

// A usbip stream (tunnel.KindUSBIP) names the UKEY it carries in its
// header's MetaKey. It is answered as a forward is, with one reply before
// any data: by the console to the box whose workload holds the key's
// lease, and by the key's box to the console. Then it carries USB/IP.
const MetaKey = "key"

// MaxReason bounds the reason in a refused forward's reply.
const MaxReason = 512

// ErrBadReply is wrapped by the errors of a reply that is not one.
var ErrBadReply = errors.New("bad forward reply")

// ErrRefused is wrapped by the error ReadReply returns when
// the box could not connect.
var ErrRefused = errors.New("the box could not connect")

// WriteReply writes the box's answer: connected when err is nil.
func WriteReply(w io.Writer, err error) error {
	if err == nil {
		_, werr := w.Write([]byte{0})
		return werr
	}
	msg := err.Error()
	if len(msg) > MaxReason {
		msg = msg[:MaxReason]
	}
	b := make([]byte, 3, 3+len(msg))
	b[0] = 1
	binary.BigEndian.PutUint16(b[1:], uint16(len(msg)))
	_, werr := w.Write(append(b, msg...))
	return werr
}

// ReadReply reads the box's answer: nil when it connected.
func ReadReply(r io.Reader) error {
	var b [3]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return fmt.Errorf("reading the box's answer to a forward: %w", err)
	}
	switch b[0] {
	case 0:
		return nil
	case 1:
	default:
		return fmt.Errorf("%w: a forward answer of kind %d", ErrBadReply, b[0])
	}
	if _, err := io.ReadFull(r, b[1:]); err != nil {
		return fmt.Errorf("reading the box's answer to a forward: %w", err)
	}
	n := int(binary.BigEndian.Uint16(b[1:]))
	if n > MaxReason {
		return fmt.Errorf("%w: a forward's reason of %d bytes", ErrBadReply, n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return fmt.Errorf("reading the box's answer to a forward: %w", err)
	}
	return fmt.Errorf("%w: %s", ErrRefused, strings.ToValidUTF8(string(msg), "?"))
}

// ParseTarget checks a forward's "host:port": a host name or address,
// and a port from 1 to 65535.
func ParseTarget(t string) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(t)
	if err != nil || h == "" || len(h) > 253 {
		return "", 0, fmt.Errorf("target %q: use HOST:PORT", truncateTarget(t))
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, fmt.Errorf("target %q: the port must be 1 to 65535", truncateTarget(t))
	}
	for _, c := range h {
		if !(c == '.' || c == '-' || c == ':' || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
			return "", 0, fmt.Errorf("target %q: not a host name or address", truncateTarget(t))
		}
	}
	return h, n, nil
}

func truncateTarget(t string) string {
	if len(t) > 64 {
		return t[:64] + "…"
	}
	return t
}

// halfCloser is a connection whose sending side closes alone.
type halfCloser interface{ CloseWrite() error }

// Join copies a to b and b to a until both directions end (each end's
// EOF half-closes the other) or ctx ends; it returns the bytes each way.
func Join(ctx context.Context, a, b net.Conn) (aToB, bToA int64) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			a.Close()
			b.Close()
		case <-done:
		}
	}()
	defer close(done)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		bToA = copyHalf(a, b)
	}()
	aToB = copyHalf(b, a)
	wg.Wait()
	return aToB, bToA
}

// copyHalf copies src to dst and then closes dst's sending side (or dst,
// when it cannot half-close).
func copyHalf(dst, src net.Conn) int64 {
	n, _ := io.Copy(dst, src)
	if hc, ok := dst.(halfCloser); ok {
		hc.CloseWrite()
	} else {
		dst.Close()
	}
	return n
}
