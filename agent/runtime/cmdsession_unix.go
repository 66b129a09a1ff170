//go:build !windows

package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

var signalNumbers = map[string]syscall.Signal{
	"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL,
	"HUP": syscall.SIGHUP, "QUIT": syscall.SIGQUIT,
}

// ptyTerminal is a pseudo-terminal's master side.
type ptyTerminal struct{ *os.File }

// startInTerminal starts cmd as the leader of a new session whose
// controlling terminal is a new pseudo-terminal.
func startInTerminal(cmd *exec.Cmd, cols, rows uint16, term string) (terminal, error) {
	if term != "" {
		cmd.Env = append(cmd.Env, "TERM="+term)
	}
	// pty.StartWithAttrs makes the session and the controlling terminal;
	// keep what the caller set (the user to run as).
	attrs := cmd.SysProcAttr
	if attrs == nil {
		attrs = &syscall.SysProcAttr{}
	}
	attrs.Setsid, attrs.Setctty, attrs.Setpgid = true, true, false
	f, err := pty.StartWithAttrs(cmd, &pty.Winsize{Cols: cols, Rows: rows}, attrs)
	if err != nil {
		return nil, fmt.Errorf("starting %s in a terminal: %w", cmd.Path, err)
	}
	return ptyTerminal{f}, nil
}

// control runs f on the terminal's descriptor, which a Close meanwhile
// cannot take away (File.Fd could: the session's resize and its end race).
func (t ptyTerminal) control(f func(fd int) error) error {
	rc, err := t.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return fmt.Errorf("the terminal is closed: %w", err)
	}
	return ferr
}

func (t ptyTerminal) resize(cols, rows uint16) error {
	return t.control(func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	})
}

// signal sends the signal to the terminal's foreground process group, as
// the terminal's own ^C or ^\ would.
func (t ptyTerminal) signal(name string) error {
	return t.control(func(fd int) error {
		pgrp, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
		if err != nil {
			return fmt.Errorf("finding the terminal's foreground processes: %w", err)
		}
		return syscall.Kill(-pgrp, signalNumbers[name])
	})
}

// setProcessGroup makes cmd the leader of a process group of its own, so
// a signal reaches the children it starts too.
func setProcessGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// A new session's leader leads a new group already, and may not
	// make another.
	cmd.SysProcAttr.Setpgid = !cmd.SysProcAttr.Setsid
}

func signalGroup(cmd *exec.Cmd, name string) error {
	return syscall.Kill(-cmd.Process.Pid, signalNumbers[name])
}

// killGroup ends cmd's process group (with a terminal, its session's,
// which is the same group: the session leader leads it).
func killGroup(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Process.Kill()
}

// exitStatus is a reaped cmd's exit code, or -1 and the signal's name.
func exitStatus(cmd *exec.Cmd) (int, string) {
	if cmd.ProcessState == nil {
		return -1, ""
	}
	st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return -1, ""
	}
	if st.Signaled() {
		for n, s := range signalNumbers {
			if s == st.Signal() {
				return -1, n
			}
		}
		return -1, st.Signal().String()
	}
	return st.ExitStatus(), ""
}

// waitCommand waits for cmd; pty.Start starts it as exec.Cmd does.
func waitCommand(cmd *exec.Cmd, _ bool) error { return cmd.Wait() }
