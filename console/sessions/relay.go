package sessions

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgebox/edgebox/console/recording"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/sessionwire"
)

// relay carries one session between its operator and its box.
type relay struct {
	b       *Broker
	live    *live
	rec     Record
	op      Operator
	cancel  context.CancelCauseFunc // ends the session, saying why
	frames  chan sessionwire.Frame  // the operator's, decoded; closed when the operator's side ends
	inputs  sync.WaitGroup          // the goroutine reading the operator
	in, out atomic.Int64
	last    atomic.Int64 // unix nanoseconds of the last byte either way
}

// run carries the session until it ends and returns how.
func (s *relay) run(ctx context.Context, req Request) sessionwire.SessionExit {
	cfg := s.b.cfg
	// The operator's frames, from the start: a session waiting for its
	// approval still hears its operator leave.
	s.inputs.Add(1)
	go func() {
		defer s.inputs.Done()
		defer close(s.frames)
		if err := s.read(ctx); err != nil {
			s.cancel(err)
		}
	}()
	if s.rec.FourEyes {
		if exit, ok := s.awaitApproval(ctx); !ok {
			return exit
		}
	}

	w, err := recording.Create(s.b.recordingDir(s.rec.TenantID), s.rec.ID,
		recording.Header{Width: max(req.Cols, 1), Height: max(req.Rows, 1), Title: title(s.rec),
			Env: map[string]string{"TERM": req.Term}}, s.rec.Started, cfg.MaxRecording)
	if err != nil {
		cfg.Log.Error("a session's recording could not start; the session does not run", "err", err)
		s.rec.EndedBy = "refused"
		return sessionwire.SessionExit{Code: -1, Error: "the console could not start the session's recording"}
	}
	defer func() {
		sum, err := w.Close()
		if err != nil {
			cfg.Log.Error("a session's recording failed", "session", s.rec.ID, "err", err)
		}
		s.rec.Recording = &RecordingSummary{Chunks: sum.Chunks, Bytes: sum.Bytes, Head: sum.Head, Truncated: sum.Truncated}
	}()
	if s.rec.ApprovedBy != "" {
		w.Mark(cfg.Now(), "approved by "+s.rec.ApprovedBy)
	}

	conn, err := cfg.Agents.Conn(s.rec.Box)
	if err != nil {
		s.rec.EndedBy = "refused"
		return sessionwire.SessionExit{Code: -1, Error: fmt.Sprintf("box %s: %v", s.rec.Box, err)}
	}
	defer conn.Close()
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	stream, err := edgeboxv1.NewAgentServiceClient(conn).Exec(actx)
	if err == nil {
		err = stream.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Start{Start: &edgeboxv1.ExecStart{
			Workload: req.Workload, Command: req.Command, Tty: req.TTY, Cols: uint32(req.Cols), Rows: uint32(req.Rows), Term: req.Term}}})
	}
	var first *edgeboxv1.ExecOutput
	if err == nil || errors.Is(err, io.EOF) {
		// A box that refused the stream says why in its status, which
		// Recv returns (Send only sees that the stream ended).
		first, err = stream.Recv()
	}
	if err != nil || !first.GetStarted() {
		if cause := context.Cause(ctx); cause != nil {
			return s.ended(ctx, cause)
		}
		s.rec.EndedBy = "refused"
		if err == nil {
			err = errors.New("the box answered with no start")
		}
		return sessionwire.SessionExit{Code: -1, Error: boxError(s.rec.Box, err)}
	}
	started := sessionwire.EncodeJSONFrame(sessionwire.FrameStatus, sessionwire.SessionStatus{Session: s.rec.ID, State: "started"})
	s.op.WriteMessage(started)
	s.live.broadcast(started)
	s.last.Store(cfg.Now().UnixNano())

	var wg sync.WaitGroup
	defer wg.Wait()
	defer acancel()
	// The operator's input, to the box.
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.forward(actx, stream, w)
	}()
	// Every second: flush the recording, and end a session idle or over
	// its time.
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-actx.Done():
				return
			case <-t.C:
			}
			if err := w.Flush(); err != nil {
				// No session runs unrecorded.
				cfg.Log.Error("a session's recording failed; the session ends", "session", s.rec.ID, "err", err)
				s.cancel(errRecorder)
			}
			now := cfg.Now()
			switch {
			case now.Sub(time.Unix(0, s.last.Load())) >= cfg.IdleTimeout:
				s.cancel(errIdle)
			case now.Sub(s.rec.Started) >= cfg.MaxDuration:
				s.cancel(errTooLong)
			}
		}
	}()

	// The box's output, to the operator, the watchers and the recording.
	for {
		m, err := stream.Recv()
		if err != nil {
			return s.ended(ctx, err)
		}
		switch o := m.GetOutput().(type) {
		case *edgeboxv1.ExecOutput_Stdout:
			s.output(w, sessionwire.FrameOutput, o.Stdout)
		case *edgeboxv1.ExecOutput_Stderr:
			s.output(w, sessionwire.FrameStderr, o.Stderr)
		case *edgeboxv1.ExecOutput_Exit:
			code := int(o.Exit.GetCode())
			s.rec.ExitCode, s.rec.Signal, s.rec.Error, s.rec.EndedBy = &code, o.Exit.GetSignal(), o.Exit.GetError(), "exit"
			return sessionwire.SessionExit{Code: code, Signal: o.Exit.GetSignal(), Error: o.Exit.GetError()}
		}
	}
}

// awaitApproval holds a four-eyes session until a second user approves
// it, and reports whether one did.
func (s *relay) awaitApproval(ctx context.Context) (sessionwire.SessionExit, bool) {
	cfg := s.b.cfg
	s.op.WriteMessage(sessionwire.EncodeJSONFrame(sessionwire.FrameStatus, sessionwire.SessionStatus{Session: s.rec.ID, State: "waiting_approval",
		Message: fmt.Sprintf("box %s needs a second maintainer's approval for this session: they run 'edgebox session approve %s' or approve it in the web console (waiting up to %v)",
			cmpOr(s.rec.BoxName, s.rec.Box), s.rec.ID, cfg.ApprovalWait)}))
	t := time.NewTimer(cfg.ApprovalWait)
	defer t.Stop()
	for {
		select {
		case who := <-s.live.approve:
			now := cfg.Now()
			s.rec.ApprovedBy, s.rec.ApprovedAt = who, &now
			return sessionwire.SessionExit{}, true
		case <-t.C:
			s.rec.EndedBy = "not approved"
			return sessionwire.SessionExit{Code: -1, Error: fmt.Sprintf("no second maintainer approved the session within %v", cfg.ApprovalWait)}, false
		case <-ctx.Done():
			exit := s.ended(ctx, ctx.Err())
			if s.rec.EndedBy == "operator left" {
				s.rec.EndedBy = "not approved"
			}
			return exit, false
		case _, ok := <-s.frames:
			if !ok {
				<-ctx.Done() // read ended it, with its cause
			}
			// Input before the session runs goes nowhere.
		}
	}
}

// read decodes the operator's frames into s.frames until the operator's
// side ends, and says why: it left, or sent a bad frame.
func (s *relay) read(ctx context.Context) error {
	for {
		msg, err := s.op.ReadMessage()
		if err != nil {
			return errOpGone
		}
		f, err := sessionwire.DecodeInputFrame(msg)
		if err != nil {
			return err
		}
		select {
		case s.frames <- f:
		case <-ctx.Done():
			return nil
		}
	}
}

// forward passes the operator's frames to the box.
func (s *relay) forward(ctx context.Context, stream edgeboxv1.AgentService_ExecClient, w *recording.Writer) {
	for {
		var f sessionwire.Frame
		var ok bool
		select {
		case f, ok = <-s.frames:
		case <-ctx.Done():
			return
		}
		if !ok {
			return
		}
		now := s.b.cfg.Now()
		s.last.Store(now.UnixNano())
		var in *edgeboxv1.ExecInput
		switch f.Type {
		case sessionwire.FrameInput:
			s.in.Add(int64(len(f.Payload)))
			in = &edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Stdin{Stdin: f.Payload}}
		case sessionwire.FrameResize:
			w.Resize(now, f.Resize.Cols, f.Resize.Rows)
			if s.rec.TTY {
				s.live.resized(s.rec.ID, f.Resize)
			}
			in = &edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Resize{Resize: &edgeboxv1.ExecResize{Cols: uint32(f.Resize.Cols), Rows: uint32(f.Resize.Rows)}}}
		case sessionwire.FrameSignal:
			in = &edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Signal{Signal: f.Signal}}
		case sessionwire.FrameEOF:
			in = &edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_CloseStdin{CloseStdin: true}}
		}
		if err := stream.Send(in); err != nil {
			return // the stream ended: the output side says how
		}
	}
}

// output passes output on, and records it.
func (s *relay) output(w *recording.Writer, t byte, p []byte) {
	now := s.b.cfg.Now()
	s.out.Add(int64(len(p)))
	s.last.Store(now.UnixNano())
	w.Output(now, p)
	for len(p) > 0 {
		c := p[:min(len(p), sessionwire.MaxFramePayload)]
		msg := sessionwire.EncodeFrame(t, c)
		s.live.broadcast(msg)
		if s.op.WriteMessage(msg) != nil {
			return // the operator left; reading its side ends the session
		}
		p = p[len(c):]
	}
}

// ended says how a session whose box stream broke ended: by its cause
// (a user, idle, time, the operator, the console stopping), or the box.
func (s *relay) ended(ctx context.Context, err error) sessionwire.SessionExit {
	cause := context.Cause(ctx)
	var by endedBy
	switch {
	case errors.As(cause, &by):
		s.rec.EndedBy = cause.Error()
		return sessionwire.SessionExit{Code: -1, Error: "ended by " + by.user}
	case errors.Is(cause, errIdle):
		s.rec.EndedBy = "idle"
		return sessionwire.SessionExit{Code: -1, Error: fmt.Sprintf("ended after %v without a keystroke or output", s.b.cfg.IdleTimeout)}
	case errors.Is(cause, errTooLong):
		s.rec.EndedBy = "time limit"
		return sessionwire.SessionExit{Code: -1, Error: fmt.Sprintf("ended at the session time limit of %v", s.b.cfg.MaxDuration)}
	case errors.Is(cause, sessionwire.ErrBadFrame):
		s.rec.EndedBy = "bad input"
		return sessionwire.SessionExit{Code: -1, Error: cause.Error()}
	case errors.Is(cause, errOpGone):
		s.rec.EndedBy = "operator left"
		return sessionwire.SessionExit{Code: -1, Error: "the operator left"}
	case errors.Is(cause, errShutdown):
		s.rec.EndedBy = "console stopped"
		return sessionwire.SessionExit{Code: -1, Error: "the console is stopping"}
	case errors.Is(cause, errRecorder):
		s.rec.EndedBy = "recording failed"
		return sessionwire.SessionExit{Code: -1, Error: "the console could not go on recording the session, so it ended"}
	}
	s.rec.EndedBy = "box"
	s.rec.Error = boxError(s.rec.Box, err)
	return sessionwire.SessionExit{Code: -1, Error: s.rec.Error}
}

// causeName is how a session's end is recorded, from the cause its
// context ended with; "" for none of the broker's.
func causeName(cause error) string {
	var by endedBy
	switch {
	case errors.As(cause, &by):
		return cause.Error()
	case errors.Is(cause, errIdle):
		return "idle"
	case errors.Is(cause, errTooLong):
		return "time limit"
	case errors.Is(cause, sessionwire.ErrBadFrame):
		return "bad input"
	case errors.Is(cause, errOpGone):
		return "operator left"
	case errors.Is(cause, errShutdown):
		return "console stopped"
	case errors.Is(cause, errRecorder):
		return "recording failed"
	case errors.Is(cause, errBoxGone):
		return "box"
	}
	return ""
}
