//go:build windows

package runtime

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"

	"github.com/edgebox/edgebox/errdefs"
)

// conpty is a Windows pseudo console (ConPTY) and the pipes to it.
type conpty struct {
	hpc windows.Handle
	in  *os.File // what the console reads as typed
	out *os.File // what the console draws
}

// startInTerminal starts cmd attached to a new pseudo console. exec.Cmd
// cannot pass the console's process attribute, so the process is made
// here with CreateProcess and handed to cmd.Process; waitCommand waits
// for it.
func startInTerminal(cmd *exec.Cmd, cols, rows uint16, term string) (terminal, error) {
	var inR, inW, outR, outW windows.Handle
	if err := windows.CreatePipe(&inR, &inW, nil, 0); err != nil {
		return nil, fmt.Errorf("pseudo console: %w", err)
	}
	if err := windows.CreatePipe(&outR, &outW, nil, 0); err != nil {
		windows.CloseHandle(inR)
		windows.CloseHandle(inW)
		return nil, fmt.Errorf("pseudo console: %w", err)
	}
	var hpc windows.Handle
	err := windows.CreatePseudoConsole(windows.Coord{X: int16(cols), Y: int16(rows)}, inR, outW, 0, &hpc)
	// The console holds its own ends now.
	windows.CloseHandle(inR)
	windows.CloseHandle(outW)
	if err != nil {
		windows.CloseHandle(inW)
		windows.CloseHandle(outR)
		return nil, fmt.Errorf("pseudo console: %w", err)
	}
	t := &conpty{hpc: hpc, in: os.NewFile(uintptr(inW), "conpty-in"), out: os.NewFile(uintptr(outR), "conpty-out")}
	if err := t.start(cmd); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func (t *conpty) start(cmd *exec.Cmd) error {
	attrs, err := windows.NewProcThreadAttributeList(1)
	if err != nil {
		return fmt.Errorf("pseudo console: %w", err)
	}
	defer attrs.Delete()
	if err := attrs.Update(windows.PROC_THREAD_ATTRIBUTE_PSEUDOCONSOLE, *(*unsafe.Pointer)(unsafe.Pointer(&t.hpc)), unsafe.Sizeof(t.hpc)); err != nil {
		return fmt.Errorf("pseudo console: %w", err)
	}
	si := &windows.StartupInfoEx{ProcThreadAttributeList: attrs.List()}
	si.Cb = uint32(unsafe.Sizeof(*si))
	si.Flags = windows.STARTF_USESTDHANDLES // no inherited handles: the console is the terminal
	args := make([]string, len(cmd.Args))
	for i, a := range cmd.Args {
		args[i] = windows.EscapeArg(a)
	}
	line, err := windows.UTF16PtrFromString(strings.Join(args, " "))
	if err != nil {
		return errdefs.Invalid("command: %v", err)
	}
	app, err := windows.UTF16PtrFromString(cmd.Path)
	if err != nil {
		return errdefs.Invalid("command: %v", err)
	}
	var dir *uint16
	if cmd.Dir != "" {
		if dir, err = windows.UTF16PtrFromString(cmd.Dir); err != nil {
			return errdefs.Invalid("directory: %v", err)
		}
	}
	env := cmd.Environ()
	var block []uint16
	for _, e := range env {
		u, err := windows.UTF16FromString(e)
		if err != nil {
			return errdefs.Invalid("environment: %v", err)
		}
		block = append(block, u...)
	}
	block = append(block, 0)
	var pi windows.ProcessInformation
	flags := uint32(windows.EXTENDED_STARTUPINFO_PRESENT | windows.CREATE_UNICODE_ENVIRONMENT)
	if err := windows.CreateProcess(app, line, nil, nil, false, flags, &block[0], dir, &si.StartupInfo, &pi); err != nil {
		return fmt.Errorf("starting %s in a pseudo console: %w", cmd.Path, err)
	}
	windows.CloseHandle(pi.Thread)
	p, err := os.FindProcess(int(pi.ProcessId))
	windows.CloseHandle(pi.Process)
	if err != nil {
		return fmt.Errorf("starting %s in a pseudo console: %w", cmd.Path, err)
	}
	cmd.Process = p
	return nil
}

func (t *conpty) Read(p []byte) (int, error)  { return t.out.Read(p) }
func (t *conpty) Write(p []byte) (int, error) { return t.in.Write(p) }

// Close closes the console, which ends what still runs in it, then the
// pipes.
func (t *conpty) Close() error {
	windows.ClosePseudoConsole(t.hpc)
	t.in.Close()
	return t.out.Close()
}

func (t *conpty) resize(cols, rows uint16) error {
	return windows.ResizePseudoConsole(t.hpc, windows.Coord{X: int16(cols), Y: int16(rows)})
}

// signal types what the console turns into the signal: ^C (INT) and ^\
// have no other way into a console program. The rest end the process.
func (t *conpty) signal(name string) error {
	switch name {
	case "INT":
		_, err := t.in.Write([]byte{0x03})
		return err
	case "QUIT":
		_, err := t.in.Write([]byte{0x1c})
		return err
	}
	return errors.New("use KILL: a Windows console program takes no other signal")
}

func setProcessGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.CreationFlags |= windows.CREATE_NEW_PROCESS_GROUP
}

// signalGroup: a Windows process without a console takes only an end.
func signalGroup(cmd *exec.Cmd, name string) error {
	switch name {
	case "KILL", "TERM":
		return cmd.Process.Kill()
	}
	return errdefs.Invalid("signal %s: a Windows program without a terminal takes only KILL or TERM", name)
}

func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		cmd.Process.Kill()
	}
}

// waitCommand waits for cmd, started by startInTerminal when inTerminal,
// else by exec.Cmd.
func waitCommand(cmd *exec.Cmd, inTerminal bool) error {
	if !inTerminal {
		return cmd.Wait()
	}
	st, err := cmd.Process.Wait()
	cmd.ProcessState = st
	return err
}

// exitStatus is a reaped cmd's exit code.
func exitStatus(cmd *exec.Cmd) (int, string) {
	if cmd.ProcessState == nil {
		return -1, ""
	}
	return cmd.ProcessState.ExitCode(), ""
}
