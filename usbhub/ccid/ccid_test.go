package ccid

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

func message(typ, seq byte, body []byte) []byte {
	m := []byte{typ}
	m = binary.LittleEndian.AppendUint32(m, uint32(len(body)))
	return append(append(m, 0, seq, 0, 0, 0), body...)
}

// TestTheReaderAnswersEveryCommand: each command gets one answer, with
// its sequence number; one the reader does not know, or cannot read, is
// answered as failed; an APDU before the card is powered is refused.
func TestTheReaderAnswersEveryCommand(t *testing.T) {
	k := New(1, 2, "S1")
	for _, tc := range []struct {
		name   string
		msg    []byte
		typ    byte
		status byte
	}{
		{"slot status, card off", message(pcGetSlotStatus, 1, nil), rdrSlotStatus, iccInactive},
		{"an APDU to a card off", message(pcXfrBlock, 2, []byte{0, 0xA4, 4, 0}), rdrDataBlock, statusFailed | iccInactive},
		{"power on", message(pcIccPowerOn, 3, nil), rdrDataBlock, iccActive},
		{"parameters", message(pcGetParameters, 4, nil), rdrParameters, iccActive},
		{"a command it does not know", message(0x6B, 5, nil), rdrSlotStatus, statusFailed | iccActive},
		{"a length that lies", append(message(pcXfrBlock, 6, []byte{1, 2}), 3), rdrSlotStatus, statusFailed | iccInactive},
		{"power off", message(pcIccPowerOff, 7, nil), rdrSlotStatus, iccInactive},
	} {
		if _, err := k.Transfer(t.Context(), EndpointOut, tc.msg, 0); err != nil {
			t.Fatal(err)
		}
		a, err := k.Transfer(t.Context(), EndpointIn, nil, 1024)
		if err != nil {
			t.Fatal(err)
		}
		if a[0] != tc.typ || a[6] != tc.msg[6] || a[7] != tc.status {
			t.Errorf("%s: answer %x, want type %#x, seq %d, status %#x", tc.name, a, tc.typ, tc.msg[6], tc.status)
		}
	}
	// Nothing more to read: a read waits, as the device NAKs, until its
	// context ends.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := k.Transfer(ctx, EndpointIn, nil, 64); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read with no answer due: %v", err)
	}
	if _, err := k.Transfer(t.Context(), 0x05, nil, 64); !errors.Is(err, usbdev.ErrStall) {
		t.Fatalf("an endpoint the reader has not: %v", err)
	}
}

func TestCommandData(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		data []byte
		ok   bool
	}{
		{nil, nil, true},
		{[]byte{0}, nil, true},                       // Le only
		{[]byte{2, 'a', 'b'}, []byte("ab"), true},    // Lc, data
		{[]byte{2, 'a', 'b', 0}, []byte("ab"), true}, // Lc, data, Le
		{[]byte{3, 'a', 'b'}, nil, false},            // Lc past the end
		{[]byte{1, 'a', 'b', 'c'}, nil, false},       // bytes after Le
	} {
		data, ok := commandData(tc.in)
		if ok != tc.ok || !bytes.Equal(data, tc.data) {
			t.Errorf("%x: %x %v, want %x %v", tc.in, data, ok, tc.data, tc.ok)
		}
	}
}

// FuzzCommand: any bytes on the bulk OUT endpoint get one well-formed
// answer from the reader.
func FuzzCommand(f *testing.F) {
	f.Add(message(pcIccPowerOn, 1, nil))
	f.Add(message(pcXfrBlock, 2, append([]byte{0, 0xA4, 4, 0, byte(len(AID))}, AID...)))
	f.Add(message(pcXfrBlock, 3, []byte{0, 0x2A, 0x9E, 0x9A, 1, 'x', 0}))
	f.Fuzz(func(t *testing.T, m []byte) {
		k := New(1, 2, "S1")
		k.command(message(pcIccPowerOn, 0, nil))
		a := k.command(m)
		if len(a) < 10 || int(binary.LittleEndian.Uint32(a[1:5])) != len(a)-10 {
			t.Fatalf("answer %x to %x", a, m)
		}
		if a[0] != rdrDataBlock && a[0] != rdrSlotStatus && a[0] != rdrParameters {
			t.Fatalf("answer type %#x", a[0])
		}
	})
}

// TestTwoCommandsWithoutReading: a host that sends a second command
// before it reads the first answer gets the second answer, and the key
// goes on.
func TestTwoCommandsWithoutReading(t *testing.T) {
	k := New(1, 2, "x")
	ctx := context.Background()
	power := []byte{0x62, 0, 0, 0, 0, 0, 1, 0, 0, 0}
	for range 3 {
		if _, err := k.Transfer(ctx, EndpointOut, power, 0); err != nil {
			t.Fatal(err)
		}
	}
	in, err := k.Transfer(ctx, EndpointIn, nil, 512)
	if err != nil || len(in) < 10 || in[0] != 0x80 {
		t.Fatalf("the answer: %x, %v", in, err)
	}
}
