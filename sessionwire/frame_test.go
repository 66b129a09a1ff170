package sessionwire

import (
	"bytes"
	"errors"
	"testing"
)

func TestDecodeInputFrame(t *testing.T) {
	for _, tc := range []struct {
		msg  []byte
		ok   bool
		want Frame
	}{
		{EncodeFrame(FrameInput, []byte("ls\n")), true, Frame{Type: FrameInput, Payload: []byte("ls\n")}},
		{EncodeJSONFrame(FrameResize, Resize{Cols: 120, Rows: 40}), true, Frame{Type: FrameResize, Resize: Resize{120, 40}}},
		{EncodeFrame(FrameSignal, []byte("INT")), true, Frame{Type: FrameSignal, Signal: "INT"}},
		{EncodeFrame(FrameEOF, nil), true, Frame{Type: FrameEOF}},
		{nil, false, Frame{}},
		{EncodeFrame(FrameInput, bytes.Repeat([]byte("x"), MaxFramePayload+1)), false, Frame{}},
		{EncodeFrame(FrameResize, []byte(`{"cols":0,"rows":24}`)), false, Frame{}},
		{EncodeFrame(FrameResize, []byte(`{"cols":80,"rows":100000}`)), false, Frame{}},
		{EncodeFrame(FrameResize, []byte(`{"cols":80,`)), false, Frame{}},
		{EncodeFrame(FrameSignal, []byte("STOP")), false, Frame{}},
		{EncodeFrame(FrameEOF, []byte("x")), false, Frame{}},
		{EncodeFrame(FrameOutput, []byte("x")), false, Frame{}}, // the console's, not the operator's
		{EncodeFrame(200, nil), false, Frame{}},
	} {
		f, err := DecodeInputFrame(tc.msg)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadFrame)) {
			t.Errorf("%q: %v", tc.msg, err)
			continue
		}
		if tc.ok && (f.Type != tc.want.Type || f.Resize != tc.want.Resize || f.Signal != tc.want.Signal ||
			(tc.want.Payload != nil && !bytes.Equal(f.Payload, tc.want.Payload))) {
			t.Errorf("%q decoded as %+v", tc.msg, f)
		}
	}
}

// FuzzDecodeInputFrame: whatever an operator's connection sends, the
// decoder answers with a frame within bounds or ErrBadFrame, never a
// panic.
func FuzzDecodeInputFrame(f *testing.F) {
	f.Add(EncodeFrame(FrameInput, []byte("ls\n")))
	f.Add(EncodeJSONFrame(FrameResize, Resize{Cols: 80, Rows: 24}))
	f.Add(EncodeFrame(FrameSignal, []byte("TERM")))
	f.Add(EncodeFrame(FrameEOF, nil))
	f.Add([]byte{FrameResize, '{', '"', 'c'})
	f.Fuzz(func(t *testing.T, msg []byte) {
		fr, err := DecodeInputFrame(msg)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("%v is not ErrBadFrame", err)
			}
			return
		}
		if len(fr.Payload) > MaxFramePayload {
			t.Fatalf("a payload of %d bytes", len(fr.Payload))
		}
		if fr.Type == FrameResize && (fr.Resize.Cols < 1 || fr.Resize.Rows < 1 || fr.Resize.Cols > MaxTerminalSize || fr.Resize.Rows > MaxTerminalSize) {
			t.Fatalf("resize %+v", fr.Resize)
		}
	})
}
