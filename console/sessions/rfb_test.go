package sessions

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// rfbClient builds what a viewer sends after the handshake.
func rfbMsgs() (all, kept []byte) {
	var a, k bytes.Buffer
	add := func(m []byte, pass bool) {
		a.Write(m)
		if pass {
			k.Write(m)
		}
	}
	add(append([]byte{rfbSetPixelFormat}, make([]byte, 19)...), true)
	enc := []byte{rfbSetEncodings, 0, 0, 2, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x21}
	add(enc, true)
	add([]byte{rfbUpdateRequest, 0, 0, 0, 0, 0, 3, 0x20, 2, 0x58}, true)
	add([]byte{rfbKeyEvent, 1, 0, 0, 0, 0, 0xff, 0x0d}, false)                        // Enter
	add([]byte{rfbPointerEvent, 1, 0, 10, 0, 20}, false)                              // a click
	add([]byte{rfbClientCutText, 0, 0, 0, 0, 0, 0, 3, 'r', 'm', '!'}, false)          // the clipboard
	add([]byte{rfbClientCutText, 0, 0, 0, 0xff, 0xff, 0xff, 0xfc, 0, 0, 0, 1}, false) // the extended clipboard: -4
	add([]byte{rfbQEMU, 0, 0, 1, 0, 0, 0, 0x0d, 0, 0, 0, 0x1c}, false)                // an extended key
	add([]byte{rfbContinuousUpdates, 1, 0, 0, 0, 0, 3, 0x20, 2, 0x58}, true)
	add([]byte{rfbClientFence, 0, 0, 0, 0, 0, 0, 0, 2, 'a', 'b'}, true)
	add([]byte{rfbUpdateRequest, 1, 0, 0, 0, 0, 3, 0x20, 2, 0x58}, true)
	return a.Bytes(), k.Bytes()
}

var rfbHandshake = []byte("RFB 003.008\n\x01\x01")

func TestViewOnlyPassesTheScreenAndNothingElse(t *testing.T) {
	all, kept := rfbMsgs()
	var out bytes.Buffer
	inputs := 0
	f := &viewOnly{r: bytes.NewReader(append(append([]byte{}, rfbHandshake...), all...)), onInput: func() { inputs++ }}
	if err := f.copy(&out); !errors.Is(err, io.EOF) {
		t.Fatalf("copy: %v", err)
	}
	if want := append(append([]byte{}, rfbHandshake...), kept...); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("passed %x\nwant   %x", out.Bytes(), want)
	}
	if f.dropped != 5 || inputs != 5 {
		t.Fatalf("dropped %d, inputs %d; want 5 each", f.dropped, inputs)
	}
	// Interactive: everything passes, and the inputs are counted.
	out.Reset()
	inputs = 0
	f = &viewOnly{r: bytes.NewReader(append(append([]byte{}, rfbHandshake...), all...)), interactive: true, onInput: func() { inputs++ }}
	f.copy(&out)
	if !bytes.Equal(out.Bytes(), append(append([]byte{}, rfbHandshake...), all...)) || inputs != 5 {
		t.Fatalf("interactive: passed %d of %d bytes, %d inputs", out.Len(), len(rfbHandshake)+len(all), inputs)
	}
}

func TestViewOnlyRefusesWhatItDoesNotKnow(t *testing.T) {
	big := make([]byte, 8)
	big[0] = rfbClientCutText
	binary.BigEndian.PutUint32(big[4:], 1<<30)
	for name, in := range map[string][]byte{
		"version 3.3":    []byte("RFB 003.003\n\x01"),
		"not RFB":        []byte("GET / HTTP/1.1\r\n"),
		"unknown type":   append(append([]byte{}, rfbHandshake...), 77),
		"huge cut text":  append(append([]byte{}, rfbHandshake...), big...),
		"many encodings": append(append([]byte{}, rfbHandshake...), rfbSetEncodings, 0, 0xff, 0xff),
		"unknown QEMU":   append(append([]byte{}, rfbHandshake...), rfbQEMU, 9),
	} {
		err := (&viewOnly{r: bytes.NewReader(in)}).copy(io.Discard)
		if !errors.Is(err, ErrRFB) {
			t.Errorf("%s: %v, want ErrRFB", name, err)
		}
	}
}

// FuzzViewOnly: whatever a viewer sends, the filter passes only whole
// messages of the kinds a watcher may send, or stops with an error; it
// never panics or reads past its bounds.
func FuzzViewOnly(f *testing.F) {
	all, _ := rfbMsgs()
	f.Add(append(append([]byte{}, rfbHandshake...), all...))
	f.Add(append(append([]byte{}, rfbHandshake...), rfbQEMU, 1, 0, 2, 1, 2, 3, 4, 5, 6))
	f.Add(append(append([]byte{}, rfbHandshake...), rfbSetDesktopSize, 0, 0, 0, 0, 0, 1, 0))
	// noVNC's extended clipboard: a negative length, -8 here.
	f.Add(append(append([]byte{}, rfbHandshake...), rfbClientCutText, 0, 0, 0, 0xff, 0xff, 0xff, 0xf8, 1, 2, 3, 4, 5, 6, 7, 8))
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		v := &viewOnly{r: bytes.NewReader(in)}
		v.copy(&out)
		// What passed, after the handshake, parses again as messages
		// that may pass, each whole.
		if out.Len() < len(rfbHandshake) {
			return
		}
		again := &viewOnly{r: bytes.NewReader(out.Bytes()[len(rfbHandshake):])}
		for {
			_, pass, err := again.next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("passed bytes do not parse: %v", err)
				}
				return
			}
			if !pass {
				t.Fatal("an input message passed a view-only screen")
			}
		}
	})
}
