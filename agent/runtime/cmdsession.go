package runtime

import (
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgebox/edgebox/errdefs"
)

// drainAfterExit bounds how long a session's output is still copied once
// its process has ended: a child it left in the background may hold the
// terminal open for ever.
const drainAfterExit = time.Second

// cmdSession is a session whose process is a program the agent started:
// on the box itself, or as a native workload's user.
type cmdSession struct {
	cmd    *exec.Cmd
	term   terminal // nil without a TTY
	copied chan struct{}
	stdin  io.Closer // the pipe to the process, without a TTY

	ended    atomic.Bool // the process was reaped
	once     sync.Once
	waitCode int
	waitSig  string
	waitErr  error
}

// terminal is a session's pseudo-terminal.
type terminal interface {
	io.ReadWriteCloser
	resize(cols, rows uint16) error
	// signal sends sig to the terminal's foreground processes.
	signal(name string) error
}

// StartCommand starts cmd for a session: in a new pseudo-terminal of the
// spec's size when s.TTY (ConPTY on Windows), else with pipes. cmd's
// stdio must be unset.
func StartCommand(cmd *exec.Cmd, s SessionSpec) (SessionProcess, error) {
	p := &cmdSession{cmd: cmd, copied: make(chan struct{})}
	if s.TTY {
		cols, rows := termSize(s.Cols, s.Rows)
		t, err := startInTerminal(cmd, cols, rows, s.Term)
		if err != nil {
			return nil, err
		}
		p.term = t
		go func() {
			defer close(p.copied)
			io.Copy(s.Stdout, t) // ends with EIO once the terminal closes
		}()
		go func() {
			io.Copy(t, s.Stdin) // ends when the session's input does
		}()
		return p, nil
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = s.Stdout, s.Stderr
	// A child left running in the background may hold the output open:
	// Wait waits for it only so long.
	cmd.WaitDelay = drainAfterExit
	setProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		return nil, errdefs.Invalid("starting %s: %v", cmd.Path, err)
	}
	p.stdin = in
	go func() {
		io.Copy(in, s.Stdin)
		in.Close() // the process sees EOF
		// Input after the process closed its own goes nowhere, and
		// does not hold up its sender.
		io.Copy(io.Discard, s.Stdin)
	}()
	close(p.copied) // exec.Cmd copies output itself, and Wait waits for it
	return p, nil
}

func termSize(cols, rows uint16) (uint16, uint16) {
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	return cols, rows
}

func (p *cmdSession) Resize(cols, rows uint16) error {
	if p.term == nil {
		return nil
	}
	return p.term.resize(termSize(cols, rows))
}

func (p *cmdSession) Signal(name string) error {
	if !slices.Contains(SessionSignals, name) {
		return errdefs.Invalid("no signal %q: use one of %v", name, SessionSignals)
	}
	if name == "KILL" {
		killGroup(p.cmd)
		return nil
	}
	if p.term != nil {
		return p.term.signal(name)
	}
	return signalGroup(p.cmd, name)
}

func (p *cmdSession) Wait() (int, string, error) {
	p.once.Do(func() {
		err := waitCommand(p.cmd, p.term != nil)
		p.ended.Store(true)
		select {
		case <-p.copied:
		case <-time.After(drainAfterExit):
		}
		if p.term != nil {
			p.term.Close()
		}
		p.waitCode, p.waitSig = exitStatus(p.cmd)
		if _, exited := err.(*exec.ExitError); err != nil && !exited {
			p.waitErr = fmt.Errorf("waiting for %s: %w", p.cmd.Path, err)
		}
	})
	return p.waitCode, p.waitSig, p.waitErr
}

func (p *cmdSession) Close() error {
	if !p.ended.Load() {
		killGroup(p.cmd)
	}
	p.Wait()
	if p.stdin != nil {
		p.stdin.Close()
	}
	return nil
}
