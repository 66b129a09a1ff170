//go:build linux

package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	cerrdefs "github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
)

var signalNumbers = map[string]syscall.Signal{
	"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL,
	"HUP": syscall.SIGHUP, "QUIT": syscall.SIGQUIT,
}

// Session runs a command, or /bin/sh, in the running container with the
// container's environment and user, in a terminal when asked.
func (d *Driver) Session(ctx context.Context, name string, s runtime.SessionSpec) (runtime.SessionProcess, error) {
	// The process outlives the call that starts it; Close ends it.
	ctx = ns(context.WithoutCancel(ctx))
	c, err := d.c.LoadContainer(ctx, name)
	if err != nil {
		return nil, translate(err, "instance %s", name)
	}
	t, err := c.Task(ctx, nil)
	if cerrdefs.IsNotFound(err) {
		return nil, errdefs.Conflict("workload %s is not running", name)
	} else if err != nil {
		return nil, translate(err, "instance %s", name)
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		return nil, translate(err, "instance %s", name)
	}
	ps := *spec.Process
	ps.Args = s.Command
	if len(ps.Args) == 0 {
		ps.Args = []string{"/bin/sh"}
	}
	ps.Terminal = s.TTY
	stdin := s.Stdin
	var typed *io.PipeWriter
	if s.TTY {
		// The container's terminal is the shim's, out of the agent's
		// reach: a signal is typed into it (typeSignal) through this
		// pipe, beside the operator's input, which ends when the
		// session's own input does.
		var pr *io.PipeReader
		pr, typed = io.Pipe()
		go func() {
			_, err := io.Copy(typed, s.Stdin)
			typed.CloseWithError(err)
		}()
		stdin = pr
	}
	opts := []cio.Opt{cio.WithStreams(stdin, s.Stdout, s.Stderr)}
	if s.TTY {
		cols, rows := s.Cols, s.Rows
		if cols == 0 || rows == 0 {
			cols, rows = 80, 24
		}
		ps.ConsoleSize = &specs.Box{Width: uint(cols), Height: uint(rows)}
		if s.Term != "" {
			ps.Env = append(append([]string(nil), ps.Env...), "TERM="+s.Term)
		}
		opts = append(opts, cio.WithTerminal)
	}
	id := fmt.Sprintf("session-%d", d.execs.Add(1))
	p, err := t.Exec(ctx, id, &ps, cio.NewCreator(opts...))
	if err != nil {
		return nil, translate(err, "session in %s", name)
	}
	exited, err := p.Wait(ctx)
	if err != nil {
		p.Delete(ctx)
		return nil, translate(err, "session in %s", name)
	}
	if err := p.Start(ctx); err != nil {
		p.Delete(ctx)
		return nil, errdefs.Invalid("starting %v in %s: %v", ps.Args, name, err)
	}
	return &ctrSession{ctx: ctx, p: p, exited: exited, tty: s.TTY, typed: typed}, nil
}

// ctrSession is a session's process in a container.
type ctrSession struct {
	ctx    context.Context
	p      client.Process
	exited <-chan client.ExitStatus
	tty    bool
	typed  *io.PipeWriter // the terminal's input, with a terminal

	once sync.Once
	code int
	sig  string
	err  error
}

func (p *ctrSession) Resize(cols, rows uint16) error {
	if !p.tty {
		return nil
	}
	return p.p.Resize(p.ctx, uint32(cols), uint32(rows))
}

func (p *ctrSession) Signal(name string) error {
	sig, ok := signalNumbers[name]
	if !ok {
		return errdefs.Invalid("no signal %q: use one of %v", name, runtime.SessionSignals)
	}
	if p.typed != nil && p.typeSignal(name) {
		return nil
	}
	return p.p.Kill(p.ctx, sig)
}

// typeSignal types INT or QUIT into the session's terminal as ^C or ^\,
// so that, as at a terminal of one's own, the foreground job gets it
// rather than the shell that started it; a program that reads keys raw
// gets the key. It reports whether it did: not for another signal, nor
// once the input has ended.
func (p *ctrSession) typeSignal(name string) bool {
	var key byte
	switch name {
	case "INT":
		key = 0x03
	case "QUIT":
		key = 0x1c
	default:
		return false
	}
	_, err := p.typed.Write([]byte{key})
	return err == nil
}

func (p *ctrSession) Wait() (int, string, error) {
	p.once.Do(func() {
		st := <-p.exited
		// All output written; a child left in the background may hold
		// the streams open, so not for ever.
		drained := make(chan struct{})
		go func() { p.p.IO().Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(time.Second):
			p.p.IO().Cancel()
		}
		code, _, err := st.Result()
		p.code, p.err = int(code), err
		if code > 128 && code < 128+65 {
			for n, s := range signalNumbers {
				if int(s) == int(code)-128 {
					p.code, p.sig = -1, n
				}
			}
		}
	})
	return p.code, p.sig, p.err
}

func (p *ctrSession) Close() error {
	p.p.Kill(p.ctx, syscall.SIGKILL) // an error if it has ended: nothing to do
	p.Wait()
	_, err := p.p.Delete(p.ctx, client.WithProcessKill)
	p.p.IO().Close()
	if p.typed != nil {
		p.typed.CloseWithError(errors.New("the session ended"))
	}
	return err
}
