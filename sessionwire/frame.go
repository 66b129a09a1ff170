// Package sessionwire is the frame protocol of a remote session between
// an operator (the edgebox CLI, the web console) and the console, over a
// WebSocket. The api package and the console's session broker both speak
// it.
package sessionwire

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// A remote session (edgebox exec, edgebox shell, the web terminal) runs
// over a WebSocket to the console. Each binary message is one frame: a
// type byte, then its payload. Text messages are not used.
//
// From the operator:
//
//	FrameInput     bytes for the process's input
//	FrameResize    JSON Resize
//	FrameSignal    a signal's name: INT, TERM, KILL, HUP or QUIT
//	FrameEOF       the end of input (no payload)
//
// From the console:
//
//	FrameOutput    bytes the process wrote (with a terminal, all of them)
//	FrameStderr    bytes it wrote to stderr, without a terminal
//	FrameStatus    JSON SessionStatus: waiting for approval, started; to
//	               a watcher, the watched terminal's size
//	FrameExit      JSON SessionExit, the last frame
const (
	FrameInput  byte = 0
	FrameOutput byte = 1
	FrameStderr byte = 2
	FrameResize byte = 3
	FrameSignal byte = 4
	FrameEOF    byte = 5
	FrameStatus byte = 6
	FrameExit   byte = 7
)

// MaxFramePayload bounds one frame's payload; longer input is split.
const MaxFramePayload = 32 << 10

// MaxTerminalSize bounds a terminal's columns and rows.
const MaxTerminalSize = 1000

// Resize is a terminal's new size.
type Resize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// SessionStatus tells the operator how the session stands before it
// runs, and a watcher what it watches.
type SessionStatus struct {
	Session string `json:"session"`
	// State is "waiting_approval" (a second maintainer must approve;
	// Message says how) or "started"; to a watcher, "watching" first,
	// then "resized" whenever the operator's terminal changes size.
	State   string `json:"state"`
	Message string `json:"message,omitempty"`
	// Cols and Rows are the watched terminal's size ("watching",
	// "resized"); zero for a session without a terminal.
	Cols int `json:"cols,omitempty"`
	Rows int `json:"rows,omitempty"`
}

// SessionExit is how a session ended.
type SessionExit struct {
	Code   int    `json:"code"`             // the process's exit code; -1 if a signal or the console ended it
	Signal string `json:"signal,omitempty"` // the signal that ended the process
	// Error says why the session ended, when the process did not end it
	// itself: refused, idle, over its time, ended by a user, the box
	// went away.
	Error string `json:"error,omitempty"`
}

// Signals a session takes.
var Signals = []string{"INT", "TERM", "KILL", "HUP", "QUIT"}

// Frame is one decoded frame.
type Frame struct {
	Type    byte
	Payload []byte
	Resize  Resize // FrameResize
	Signal  string // FrameSignal
}

// ErrBadFrame is wrapped by every error DecodeFrame returns.
var ErrBadFrame = errors.New("bad session frame")

// DecodeInputFrame decodes a frame from the operator, checking it whole:
// its type, its size, a resize's bounds and a signal's name.
func DecodeInputFrame(msg []byte) (Frame, error) {
	if len(msg) == 0 {
		return Frame{}, fmt.Errorf("%w: empty", ErrBadFrame)
	}
	if len(msg)-1 > MaxFramePayload {
		return Frame{}, fmt.Errorf("%w: %d bytes of payload; at most %d", ErrBadFrame, len(msg)-1, MaxFramePayload)
	}
	f := Frame{Type: msg[0], Payload: msg[1:]}
	switch f.Type {
	case FrameInput:
	case FrameResize:
		if len(f.Payload) > 64 || json.Unmarshal(f.Payload, &f.Resize) != nil {
			return Frame{}, fmt.Errorf("%w: a resize is {\"cols\":N,\"rows\":N}", ErrBadFrame)
		}
		if c, r := f.Resize.Cols, f.Resize.Rows; c < 1 || r < 1 || c > MaxTerminalSize || r > MaxTerminalSize {
			return Frame{}, fmt.Errorf("%w: a terminal of %dx%d; 1x1 to %dx%d", ErrBadFrame, c, r, MaxTerminalSize, MaxTerminalSize)
		}
	case FrameSignal:
		f.Signal = string(f.Payload)
		if !slices.Contains(Signals, f.Signal) {
			return Frame{}, fmt.Errorf("%w: no signal %.16q; use one of %v", ErrBadFrame, f.Signal, Signals)
		}
	case FrameEOF:
		if len(f.Payload) != 0 {
			return Frame{}, fmt.Errorf("%w: the end of input has no payload", ErrBadFrame)
		}
	default:
		return Frame{}, fmt.Errorf("%w: type %d is not the operator's", ErrBadFrame, f.Type)
	}
	return f, nil
}

// EncodeFrame returns the message of a frame of type t.
func EncodeFrame(t byte, payload []byte) []byte {
	return append([]byte{t}, payload...)
}

// EncodeJSONFrame returns the message of a frame of type t carrying v.
func EncodeJSONFrame(t byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the frame types above only
	}
	return EncodeFrame(t, b)
}
