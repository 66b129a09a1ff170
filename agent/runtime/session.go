package runtime

import (
	"context"
	"io"
)

// Sessioner is a driver that opens remote maintenance sessions in its
// running instances: a command or a shell in a container or as a native
// program's user, or a VM's serial console.
type Sessioner interface {
	Session(ctx context.Context, name string, s SessionSpec) (SessionProcess, error)
}

// SessionSpec is what a session runs and where its bytes go.
type SessionSpec struct {
	// Command is the program and its arguments; empty is an interactive
	// shell (for a VM, the serial console, which takes no command).
	Command []string
	// TTY asks for a terminal: stdout and stderr are one stream, written
	// to Stdout.
	TTY        bool
	Cols, Rows uint16
	Term       string
	// Stdin is what the process reads; its EOF closes the process's input.
	Stdin io.Reader
	// Stdout and Stderr get the process's output. They may block: the
	// process then waits, so output is never held without bound.
	Stdout, Stderr io.Writer
}

// Signals a session may send, by name.
var SessionSignals = []string{"INT", "TERM", "KILL", "HUP", "QUIT"}

// SessionProcess is a session's running process.
type SessionProcess interface {
	// Resize sets the terminal's size; without a terminal it does nothing.
	Resize(cols, rows uint16) error
	// Signal sends one of SessionSignals: to the terminal's foreground
	// processes with a TTY, else to the process and its children.
	Signal(name string) error
	// Wait returns once the process has ended and its output is written:
	// its exit code, or -1 and the signal that ended it.
	Wait() (code int, signal string, err error)
	// Close ends the process if it still runs and frees what it holds.
	Close() error
}
