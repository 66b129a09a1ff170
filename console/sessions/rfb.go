package sessions

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// viewOnly copies a VNC viewer's side of an RFB stream (RFC 6143) to the
// VM, dropping every message that would act on it: keys, the pointer,
// the clipboard, QEMU's extended keys. It follows the handshake (version,
// security type, client init), then reads each client message whole, so
// nothing can be smuggled inside another; a message it does not know ends
// the stream. Only the "None" security type is expected: the VM's VNC
// socket is local to the box and takes no password.
type viewOnly struct {
	r   io.Reader
	buf [maxRFBMessage]byte
	// interactive passes every message (bounded and parsed all the same);
	// onInput is told of each key, pointer or clipboard message either
	// way: the operator is there.
	interactive bool
	onInput     func()
	// dropped counts the messages kept from the VM.
	dropped int
}

// ErrRFB is wrapped by every error of the view-only filter.
var ErrRFB = errors.New("bad RFB from the viewer")

// Bounds on what a viewer sends.
const (
	maxRFBMessage  = 64 << 10 // one client message, cut text included
	maxRFBEncoding = 256      // encodings in one SetEncodings
)

// Client message types (RFC 6143 7.5, and the extensions noVNC sends).
const (
	rfbSetPixelFormat    = 0
	rfbSetEncodings      = 2
	rfbUpdateRequest     = 3
	rfbKeyEvent          = 4
	rfbPointerEvent      = 5
	rfbClientCutText     = 6
	rfbContinuousUpdates = 150
	rfbClientFence       = 248
	rfbXVP               = 250
	rfbSetDesktopSize    = 251
	rfbQEMU              = 255
)

// copy runs the filter from the viewer (v.r) to the VM (w) until either
// ends; it returns the error that ended it (io.EOF at the viewer's end).
func (v *viewOnly) copy(w io.Writer) error {
	// ProtocolVersion, 12 bytes: 3.7 or 3.8, in which the viewer picks
	// the security type (1 byte); then ClientInit, its shared flag (1).
	// Each goes on at once: the VM answers each before the next comes.
	for i, n := range []int{12, 1, 1} {
		b := v.buf[:n]
		if _, err := io.ReadFull(v.r, b); err != nil {
			return err
		}
		if ver := string(b); i == 0 && ver != "RFB 003.008\n" && ver != "RFB 003.007\n" {
			return fmt.Errorf("%w: protocol version %q; a view-only screen takes 3.7 or 3.8", ErrRFB, ver)
		}
		if i == 2 {
			b[0] = 1 // shared: one viewer never shuts out the others
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	for {
		msg, pass, err := v.next()
		if err != nil {
			return err
		}
		if !pass {
			if v.onInput != nil {
				v.onInput()
			}
			if !v.interactive {
				v.dropped++
				continue
			}
		}
		if _, err := w.Write(msg); err != nil {
			return err
		}
	}
}

// next reads one client message whole and says whether it may pass.
func (v *viewOnly) next() ([]byte, bool, error) {
	t := v.buf[:1]
	if _, err := io.ReadFull(v.r, t); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, false, io.EOF
		}
		return nil, false, err
	}
	// fixed reads a message of n bytes in all.
	fixed := func(n int) ([]byte, error) {
		if _, err := io.ReadFull(v.r, v.buf[1:n]); err != nil {
			return nil, err
		}
		return v.buf[:n], nil
	}
	// more reads k more bytes after the first n.
	more := func(n, k int) ([]byte, error) {
		if n+k > len(v.buf) {
			return nil, fmt.Errorf("%w: a message of %d bytes", ErrRFB, n+k)
		}
		if _, err := io.ReadFull(v.r, v.buf[n:n+k]); err != nil {
			return nil, err
		}
		return v.buf[:n+k], nil
	}
	switch t[0] {
	case rfbSetPixelFormat:
		m, err := fixed(20)
		return m, true, err
	case rfbSetEncodings:
		m, err := fixed(4)
		if err != nil {
			return nil, false, err
		}
		n := int(binary.BigEndian.Uint16(m[2:4]))
		if n > maxRFBEncoding {
			return nil, false, fmt.Errorf("%w: %d encodings", ErrRFB, n)
		}
		m, err = more(4, 4*n)
		return m, true, err
	case rfbUpdateRequest:
		m, err := fixed(10)
		return m, true, err
	case rfbContinuousUpdates:
		m, err := fixed(10)
		return m, true, err
	case rfbClientFence:
		m, err := fixed(9)
		if err != nil {
			return nil, false, err
		}
		n := int(m[8])
		if n > 64 {
			return nil, false, fmt.Errorf("%w: a fence of %d bytes", ErrRFB, n)
		}
		m, err = more(9, n)
		return m, true, err
	case rfbKeyEvent:
		m, err := fixed(8)
		return m, false, err
	case rfbPointerEvent:
		m, err := fixed(6)
		return m, false, err
	case rfbClientCutText:
		m, err := fixed(8)
		if err != nil {
			return nil, false, err
		}
		// A negative length is the extended clipboard's (noVNC sends it
		// to a QEMU that offers it): -n bytes follow all the same.
		n := int64(int32(binary.BigEndian.Uint32(m[4:8])))
		if n < 0 {
			n = -n
		}
		if n > maxRFBMessage-8 {
			return nil, false, fmt.Errorf("%w: cut text of %d bytes", ErrRFB, n)
		}
		m, err = more(8, int(n))
		return m, false, err
	case rfbXVP:
		m, err := fixed(4)
		return m, false, err // shutdown, reboot, reset: never from a watcher
	case rfbSetDesktopSize:
		m, err := fixed(8)
		if err != nil {
			return nil, false, err
		}
		n := int(m[6])
		m, err = more(8, 16*n)
		return m, false, err
	case rfbQEMU:
		m, err := fixed(2)
		if err != nil {
			return nil, false, err
		}
		switch m[1] {
		case 0: // extended key event: 12 bytes in all
			m, err = more(2, 10)
			return m, false, err
		case 1: // audio: 4 bytes, or 10 for its format
			m, err = more(2, 2)
			if err != nil {
				return nil, false, err
			}
			if binary.BigEndian.Uint16(m[2:4]) == 2 {
				m, err = more(4, 6)
			}
			return m, false, err
		}
		return nil, false, fmt.Errorf("%w: QEMU message %d", ErrRFB, m[1])
	}
	return nil, false, fmt.Errorf("%w: client message type %d", ErrRFB, t[0])
}
