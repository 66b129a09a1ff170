package session

import (
	"context"
	"os/exec"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
)

// HostSession starts a session on the box itself, as the agent's own
// user: the command, or an interactive login shell.
func HostSession(_ context.Context, s runtime.SessionSpec) (runtime.SessionProcess, error) {
	argv := s.Command
	if len(argv) == 0 {
		argv = hostShell()
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, errdefs.NotFound("no program %q on this box", argv[0])
	}
	// Not CommandContext: the session ends the process, and its output
	// is still read after the call's context ends.
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env, cmd.Dir = hostEnv()
	return runtime.StartCommand(cmd, s)
}
