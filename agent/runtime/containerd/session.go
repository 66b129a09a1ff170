//go:build linux

package containerd

import (
	"context"
	"fmt"
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
	opts := []cio.Opt{cio.WithStreams(s.Stdin, s.Stdout, s.Stderr)}
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
	return &ctrSession{ctx: ctx, p: p, exited: exited, tty: s.TTY}, nil
}

// ctrSession is a session's process in a container.
type ctrSession struct {
	ctx    context.Context
	p      client.Process
	exited <-chan client.ExitStatus
	tty    bool

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
	return p.p.Kill(p.ctx, sig)
}

func (p *ctrSession) Wait() (int, string, error) {
	p.once.Do(func() {
		st := <-p.exited
		// All output written; a child left in the background may hold
		// the streams open, so not for ever.
		io := make(chan struct{})
		go func() { p.p.IO().Wait(); close(io) }()
		select {
		case <-io:
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
	return err
}
