// Package session serves the console's remote maintenance sessions on a
// box (AgentService.Exec): a shell or a command on the box itself or in a
// workload, or a VM's serial console, with a terminal or without.
//
// The console brokers and records every session and checks who may open
// it; the box checks what a session asks for is well formed and bounded,
// and that at most MaxSessions run at once. Input and output move through
// gRPC's flow control: a session whose process does not read its input,
// or whose console does not read its output, holds a bounded amount and
// waits, and harms no other stream of the tunnel.
package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Bounds on what a session may ask for.
const (
	MaxArgs      = 64
	MaxArgBytes  = 64 << 10
	MaxTermSize  = 1000
	MaxTermName  = 64
	MaxStdin     = 64 << 10 // one input message
	outputChunk  = 32 << 10 // one output message
	defaultLimit = 32
)

// Config is what a Server needs.
type Config struct {
	// Drivers are the box's runtimes: a session in a workload goes to the
	// one that runs it, if it is a runtime.Sessioner.
	Drivers []runtime.Driver
	// Host starts a session on the box itself; nil is HostSession.
	Host func(ctx context.Context, s runtime.SessionSpec) (runtime.SessionProcess, error)
	// MaxSessions bounds the sessions running at once; 0 is 32.
	MaxSessions int
	Log         *slog.Logger
}

// Server serves AgentService.Exec.
type Server struct {
	cfg Config
	sem chan struct{}
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.Host == nil {
		cfg.Host = HostSession
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = defaultLimit
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, sem: make(chan struct{}, cfg.MaxSessions)}
}

// Stream is the agent's side of an Exec call.
type Stream interface {
	Context() context.Context
	Send(*edgeboxv1.ExecOutput) error
	Recv() (*edgeboxv1.ExecInput, error)
}

// Exec runs one session until its process ends or the console goes.
func (s *Server) Exec(stream Stream) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		return errgrpc.ToGRPC(errdefs.Unavailable("this box already runs %d sessions; end one first", cap(s.sem)))
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if err := ValidateStart(start); err != nil {
		return errgrpc.ToGRPC(err)
	}
	out := &sender{stream: stream, ready: make(chan struct{})}
	inR, inW := io.Pipe()
	defer inR.Close()
	spec := runtime.SessionSpec{Command: start.GetCommand(), TTY: start.GetTty(),
		Cols: uint16(start.GetCols()), Rows: uint16(start.GetRows()), Term: start.GetTerm(),
		Stdin: inR, Stdout: out.writer(false), Stderr: out.writer(true)}
	p, err := s.open(ctx, start.GetWorkload(), spec)
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	defer p.Close()
	// Whatever ends the call (the console ending the session, or going)
	// ends the process, even while its input is blocked.
	go func() {
		<-ctx.Done()
		p.Close()
		inR.CloseWithError(errors.New("the session ended"))
	}()
	where := cmpOr(start.GetWorkload(), "the box")
	s.cfg.Log.Info("remote session started", "in", where, "command", start.GetCommand(), "tty", start.GetTty())
	if err := out.send(&edgeboxv1.ExecOutput{Output: &edgeboxv1.ExecOutput_Started{Started: true}}); err != nil {
		return err
	}
	close(out.ready) // output may follow now

	// Input: until the console closes its side or goes. A console that
	// goes, or sends what a session may not, ends the process.
	var inputErr error
	inputDone := make(chan struct{})
	go func() {
		defer close(inputDone)
		err := s.input(stream, p, inW)
		if err != nil && !errors.Is(err, io.EOF) {
			inputErr = err
			inW.CloseWithError(err)
			p.Close()
			return
		}
		inW.Close()
	}()
	code, sig, werr := p.Wait()
	exit := &edgeboxv1.ExecExit{Code: int32(code), Signal: sig}
	select {
	case <-inputDone:
		if inputErr != nil && errdefs.Kind(inputErr) == errdefs.ErrInvalid {
			exit.Error = inputErr.Error()
		}
	default:
	}
	if werr != nil && exit.Error == "" {
		exit.Error = werr.Error()
	}
	s.cfg.Log.Info("remote session ended", "in", where, "code", code, "signal", sig)
	// The input goroutine ends when the call does, which returning ends.
	// Output still being copied after the drain goes nowhere.
	return out.last(&edgeboxv1.ExecOutput{Output: &edgeboxv1.ExecOutput_Exit{Exit: exit}})
}

// input moves the console's input to the process until its stream ends.
func (s *Server) input(stream Stream, p runtime.SessionProcess, stdin *io.PipeWriter) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch in := m.GetInput().(type) {
		case *edgeboxv1.ExecInput_Stdin:
			if len(in.Stdin) > MaxStdin {
				return errdefs.Invalid("input of %d bytes in one message; at most %d", len(in.Stdin), MaxStdin)
			}
			if _, err := stdin.Write(in.Stdin); err != nil {
				return nil // the process closed its input; later input has nowhere to go
			}
		case *edgeboxv1.ExecInput_Resize:
			c, r := in.Resize.GetCols(), in.Resize.GetRows()
			if c == 0 || r == 0 || c > MaxTermSize || r > MaxTermSize {
				continue // a bad size changes nothing
			}
			p.Resize(uint16(c), uint16(r))
		case *edgeboxv1.ExecInput_Signal:
			if err := p.Signal(in.Signal); err != nil {
				s.cfg.Log.Info("a session's signal was not sent", "signal", in.Signal, "err", err)
			}
		case *edgeboxv1.ExecInput_CloseStdin:
			stdin.Close()
		case *edgeboxv1.ExecInput_Start:
			return errdefs.Invalid("a session starts once")
		}
	}
}

// open starts the session's process on the box or in the workload.
func (s *Server) open(ctx context.Context, workload string, spec runtime.SessionSpec) (runtime.SessionProcess, error) {
	if workload == "" {
		return s.cfg.Host(ctx, spec)
	}
	for _, d := range s.cfg.Drivers {
		if _, err := d.Inspect(ctx, workload); errors.Is(err, errdefs.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, errdefs.Unavailable("%s: %v", d.Runtime(), err)
		}
		sd, ok := d.(runtime.Sessioner)
		if !ok {
			return nil, errdefs.Invalid("workload %s runs on %s, which has no sessions", workload, d.Runtime())
		}
		return sd.Session(ctx, workload, spec)
	}
	return nil, errdefs.NotFound("no workload %q runs on this box", workload)
}

// ValidateStart checks a session's start against the bounds above.
func ValidateStart(st *edgeboxv1.ExecStart) error {
	if st == nil {
		return errdefs.Invalid("a session begins with its start")
	}
	if w := st.GetWorkload(); w != "" && !edgeboxv1.ValidObjectName(w) {
		return errdefs.Invalid("workload name %q is not valid", w)
	}
	cmd := st.GetCommand()
	if len(cmd) > MaxArgs {
		return errdefs.Invalid("%d arguments; at most %d", len(cmd), MaxArgs)
	}
	n := 0
	for _, a := range cmd {
		n += len(a)
		if slices.Contains([]byte(a), 0) || !utf8.ValidString(a) {
			return errdefs.Invalid("an argument holds a NUL byte or is not UTF-8")
		}
	}
	if n > MaxArgBytes {
		return errdefs.Invalid("arguments of %d bytes; at most %d", n, MaxArgBytes)
	}
	if len(cmd) > 0 && cmd[0] == "" {
		return errdefs.Invalid("the command's program is empty")
	}
	if st.GetCols() > MaxTermSize || st.GetRows() > MaxTermSize {
		return errdefs.Invalid("a terminal of %dx%d; at most %dx%d", st.GetCols(), st.GetRows(), MaxTermSize, MaxTermSize)
	}
	t := st.GetTerm()
	if len(t) > MaxTermName {
		return errdefs.Invalid("TERM of %d bytes; at most %d", len(t), MaxTermName)
	}
	for _, c := range []byte(t) {
		if c <= ' ' || c > '~' || c == '=' {
			return errdefs.Invalid("TERM %q is not a terminal's name", t)
		}
	}
	return nil
}

// sender sends output messages, one at a time: gRPC's Send is not safe
// from several goroutines, and stdout and stderr are copied by two.
// Output waits for ready: "started" comes first.
type sender struct {
	mu     sync.Mutex
	stream Stream
	ready  chan struct{}
	done   bool // the exit is sent: nothing may follow
}

func (o *sender) send(m *edgeboxv1.ExecOutput) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return errors.New("the session has ended")
	}
	return o.stream.Send(m)
}

// last sends the exit, after which nothing is sent.
func (o *sender) last(m *edgeboxv1.ExecOutput) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = true
	return o.stream.Send(m)
}

func (o *sender) writer(stderr bool) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		select {
		case <-o.ready:
		case <-o.stream.Context().Done():
			return 0, o.stream.Context().Err()
		}
		n := 0
		for len(p) > 0 {
			c := p[:min(len(p), outputChunk)]
			m := &edgeboxv1.ExecOutput{Output: &edgeboxv1.ExecOutput_Stdout{Stdout: c}}
			if stderr {
				m = &edgeboxv1.ExecOutput{Output: &edgeboxv1.ExecOutput_Stderr{Stderr: c}}
			}
			if err := o.send(m); err != nil {
				return n, fmt.Errorf("the console is gone: %w", err)
			}
			n, p = n+len(c), p[len(c):]
		}
		return n, nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
