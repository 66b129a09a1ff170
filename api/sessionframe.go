package api

import "github.com/edgebox/edgebox/sessionwire"

// The session frame protocol (package sessionwire), as the API's
// clients name it.
type (
	Frame         = sessionwire.Frame
	Resize        = sessionwire.Resize
	SessionStatus = sessionwire.SessionStatus
	SessionExit   = sessionwire.SessionExit
)

// Frame types and bounds.
const (
	FrameInput      = sessionwire.FrameInput
	FrameOutput     = sessionwire.FrameOutput
	FrameStderr     = sessionwire.FrameStderr
	FrameResize     = sessionwire.FrameResize
	FrameSignal     = sessionwire.FrameSignal
	FrameEOF        = sessionwire.FrameEOF
	FrameStatus     = sessionwire.FrameStatus
	FrameExit       = sessionwire.FrameExit
	MaxFramePayload = sessionwire.MaxFramePayload
	MaxTerminalSize = sessionwire.MaxTerminalSize
)

// Signals a session takes.
var Signals = sessionwire.Signals

// EncodeFrame, EncodeJSONFrame and DecodeInputFrame are sessionwire's.
var (
	EncodeFrame      = sessionwire.EncodeFrame
	EncodeJSONFrame  = sessionwire.EncodeJSONFrame
	DecodeInputFrame = sessionwire.DecodeInputFrame
	ErrBadFrame      = sessionwire.ErrBadFrame
)
