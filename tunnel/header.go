package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"
)

// Kind names what a stream carries. The accepting side routes each stream to
// the listener registered for its kind.
type Kind string

// The stream kinds edgebox uses.
const (
	KindRPC      Kind = "rpc"      // gRPC, both directions
	KindSync     Kind = "sync"     // desired state down, acks and status up
	KindRegistry Kind = "registry" // HTTP to the console's OCI registry
	KindForward  Kind = "forward"  // raw bytes to a TCP target named in metadata
	KindUSBIP    Kind = "usbip"    // USB/IP to a leased key
	KindVNC      Kind = "vnc"      // a VM's screen
)

// Header limits. A header is read before anything else is known about a
// stream, so everything in it is bounded.
const (
	headerVersion  = 1
	MaxKindLen     = 32
	MaxMetaEntries = 16
	MaxMetaKeyLen  = 64
	MaxMetaLen     = 2048 // all of the encoded metadata
	maxHeaderLen   = 2 + MaxKindLen + 2 + MaxMetaLen
)

// ErrBadHeader is wrapped by every header decoding error.
var ErrBadHeader = errors.New("tunnel: bad stream header")

// Header opens every stream.
//
// Wire format (big endian):
//
//	u8  version (1)
//	u8  len(kind), kind bytes ([a-z0-9-], 1..32)
//	u16 len(meta), meta bytes (<= 2048):
//	    repeated: u8 len(key), key, u16 len(value), value
type Header struct {
	Kind Kind
	Meta map[string]string
}

func validKind(k Kind) bool {
	if len(k) == 0 || len(k) > MaxKindLen {
		return false
	}
	for _, c := range []byte(k) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// MarshalBinary encodes h, refusing anything the reader would refuse.
func (h Header) MarshalBinary() ([]byte, error) {
	if !validKind(h.Kind) {
		return nil, fmt.Errorf("%w: kind %q must be 1-%d characters of [a-z0-9-]", ErrBadHeader, h.Kind, MaxKindLen)
	}
	if len(h.Meta) > MaxMetaEntries {
		return nil, fmt.Errorf("%w: %d metadata entries, at most %d", ErrBadHeader, len(h.Meta), MaxMetaEntries)
	}
	keys := make([]string, 0, len(h.Meta))
	for k := range h.Meta {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var meta []byte
	for _, k := range keys {
		v := h.Meta[k]
		if len(k) == 0 || len(k) > MaxMetaKeyLen {
			return nil, fmt.Errorf("%w: metadata key %q must be 1-%d bytes", ErrBadHeader, k, MaxMetaKeyLen)
		}
		meta = append(meta, byte(len(k)))
		meta = append(meta, k...)
		meta = binary.BigEndian.AppendUint16(meta, uint16(min(len(v), 0xffff)))
		meta = append(meta, v...)
		if len(meta) > MaxMetaLen {
			return nil, fmt.Errorf("%w: metadata is longer than %d bytes", ErrBadHeader, MaxMetaLen)
		}
	}
	b := make([]byte, 0, 4+len(h.Kind)+len(meta))
	b = append(b, headerVersion, byte(len(h.Kind)))
	b = append(b, h.Kind...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(meta)))
	b = append(b, meta...)
	return b, nil
}

// ReadHeader reads one header from r. It never reads more than the header's
// bounded size and never allocates more than it has read.
func ReadHeader(r io.Reader) (Header, error) {
	var fixed [2]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return Header{}, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	if fixed[0] != headerVersion {
		return Header{}, fmt.Errorf("%w: version %d, want %d", ErrBadHeader, fixed[0], headerVersion)
	}
	kl := int(fixed[1])
	if kl == 0 || kl > MaxKindLen {
		return Header{}, fmt.Errorf("%w: kind length %d", ErrBadHeader, kl)
	}
	buf := make([]byte, kl+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return Header{}, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	h := Header{Kind: Kind(buf[:kl])}
	if !validKind(h.Kind) {
		return Header{}, fmt.Errorf("%w: kind %q", ErrBadHeader, h.Kind)
	}
	ml := int(binary.BigEndian.Uint16(buf[kl:]))
	if ml > MaxMetaLen {
		return Header{}, fmt.Errorf("%w: metadata length %d, at most %d", ErrBadHeader, ml, MaxMetaLen)
	}
	if ml == 0 {
		return h, nil
	}
	meta := make([]byte, ml)
	if _, err := io.ReadFull(r, meta); err != nil {
		return Header{}, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	h.Meta = make(map[string]string)
	for len(meta) > 0 {
		if len(h.Meta) == MaxMetaEntries {
			return Header{}, fmt.Errorf("%w: more than %d metadata entries", ErrBadHeader, MaxMetaEntries)
		}
		klen := int(meta[0])
		if klen == 0 || klen > MaxMetaKeyLen || len(meta) < 1+klen+2 {
			return Header{}, fmt.Errorf("%w: truncated metadata key", ErrBadHeader)
		}
		k := string(meta[1 : 1+klen])
		meta = meta[1+klen:]
		vlen := int(binary.BigEndian.Uint16(meta))
		meta = meta[2:]
		if vlen > len(meta) {
			return Header{}, fmt.Errorf("%w: truncated metadata value", ErrBadHeader)
		}
		if _, dup := h.Meta[k]; dup {
			return Header{}, fmt.Errorf("%w: duplicate metadata key %q", ErrBadHeader, k)
		}
		h.Meta[k] = string(meta[:vlen])
		meta = meta[vlen:]
	}
	return h, nil
}

// verdict is the accepting side's one-byte answer to a header, followed for
// refusals by a u8-length message. The console's answer to a box's
// handshake may also be busy, followed by a big-endian u32: the
// milliseconds after which the box may dial again.
const (
	verdictOK      byte = 0
	verdictRefused byte = 1
	verdictBusy    byte = 2
)

// MaxRetryAfter bounds the wait a busy console may ask of a box; a longer
// one is read as this.
const MaxRetryAfter = 10 * time.Minute

// ErrBusy is wrapped (in a *BusyError) when the console was too busy to
// take the session and said when to come back.
var ErrBusy = errors.New("tunnel: the console is busy")

// BusyError is the console's "not now": the box dials again after
// RetryAfter, which the console chose (and spread) for it.
type BusyError struct{ RetryAfter time.Duration }

func (e *BusyError) Error() string {
	return fmt.Sprintf("%v; come back in %s", ErrBusy, e.RetryAfter.Round(time.Millisecond))
}

func (e *BusyError) Unwrap() error { return ErrBusy }

func writeBusy(w io.Writer, after time.Duration) error {
	after = min(max(after, 0), MaxRetryAfter)
	_, err := w.Write(binary.BigEndian.AppendUint32([]byte{verdictBusy}, uint32(after.Milliseconds())))
	return err
}

// maxVerdictMsg bounds the refusal text.
const maxVerdictMsg = 255

func writeVerdict(w io.Writer, refusal string) error {
	if refusal == "" {
		_, err := w.Write([]byte{verdictOK})
		return err
	}
	if len(refusal) > maxVerdictMsg {
		refusal = refusal[:maxVerdictMsg]
	}
	b := append([]byte{verdictRefused, byte(len(refusal))}, refusal...)
	_, err := w.Write(b)
	return err
}

// ErrRefused is wrapped when the far side refused to open a stream.
var ErrRefused = errors.New("tunnel: stream refused")

func readVerdict(r io.Reader) error {
	var b [2]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return fmt.Errorf("tunnel: reading stream verdict: %w", err)
	}
	switch b[0] {
	case verdictOK:
		return nil
	case verdictBusy:
		var ms [4]byte
		if _, err := io.ReadFull(r, ms[:]); err != nil {
			return fmt.Errorf("%w: %v", ErrBusy, err)
		}
		after := time.Duration(binary.BigEndian.Uint32(ms[:])) * time.Millisecond
		return &BusyError{RetryAfter: min(after, MaxRetryAfter)}
	case verdictRefused:
		if _, err := io.ReadFull(r, b[1:2]); err != nil {
			return fmt.Errorf("%w: %v", ErrRefused, err)
		}
		msg := make([]byte, b[1])
		if _, err := io.ReadFull(r, msg); err != nil {
			return fmt.Errorf("%w: %v", ErrRefused, err)
		}
		return fmt.Errorf("%w: %s", ErrRefused, msg)
	default:
		return fmt.Errorf("tunnel: unknown stream verdict %d", b[0])
	}
}
