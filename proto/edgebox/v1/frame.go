package edgeboxv1

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/errdefs"
)

// Framing of protobuf messages on a tunnel stream (the "sync" kind): each
// message is a uvarint byte length followed by the message.

// ErrFrameTooLarge is returned for a frame longer than the reader allows.
// It is of kind errdefs.ErrInvalid.
var ErrFrameTooLarge = errdefs.Wrap(errdefs.ErrInvalid, errors.New("message frame too large"))

// WriteFrame writes m as one frame.
func WriteFrame(w io.Writer, m proto.Message) error {
	raw, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, binary.MaxVarintLen32, binary.MaxVarintLen32+proto.Size(m)), m)
	if err != nil {
		return err
	}
	body := len(raw) - binary.MaxVarintLen32
	var hdr [binary.MaxVarintLen32]byte
	n := binary.PutUvarint(hdr[:], uint64(body))
	start := binary.MaxVarintLen32 - n
	copy(raw[start:], hdr[:n])
	_, err = w.Write(raw[start:])
	return err
}

// ReadFrame reads one frame into m; a frame longer than max bytes is
// ErrFrameTooLarge and nothing of it is read. r is read without a buffer
// of its own (tunnel streams are buffered), a byte at a time for the length.
func ReadFrame(r io.Reader, m proto.Message, max int) error {
	n, err := binary.ReadUvarint(byteReader{r})
	if err != nil {
		if errors.Is(err, io.EOF) {
			return io.EOF
		}
		return fmt.Errorf("message frame: %w", err)
	}
	if n > uint64(max) {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrFrameTooLarge, n, max)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return fmt.Errorf("message frame: %w", io.ErrUnexpectedEOF)
	}
	return proto.Unmarshal(buf, m)
}

type byteReader struct{ r io.Reader }

func (b byteReader) ReadByte() (byte, error) {
	var one [1]byte
	_, err := io.ReadFull(b.r, one[:])
	return one[0], err
}
