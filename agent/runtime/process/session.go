package process

import (
	"context"
	"os/exec"
	"path/filepath"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
)

// Session runs a command, or a shell, as the workload's own user, in its
// home and with its environment: what the program itself would see.
func (d *Driver) Session(_ context.Context, name string, s runtime.SessionSpec) (runtime.SessionProcess, error) {
	d.mu.Lock()
	rec, err := d.load(name)
	running := false
	if err == nil {
		_, running = d.program(name, rec)
	}
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if !running {
		return nil, errdefs.Conflict("workload %s is not running", name)
	}
	argv := s.Command
	if len(argv) == 0 {
		argv = workloadShell()
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, errdefs.NotFound("no program %q on this box", argv[0])
	}
	home := filepath.Join(d.dir(name), "home")
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = append(baseEnv(home), rec.Env...)
	if d.cfg.AgentAPI != "" {
		cmd.Env = append(cmd.Env, runtime.AgentAPIEnv+"="+d.cfg.AgentAPI)
	}
	cmd.Dir = home
	setUser(cmd, rec.UID)
	return runtime.StartCommand(cmd, s)
}
