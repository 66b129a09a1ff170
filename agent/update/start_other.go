//go:build !linux

package update

import (
	"os"
	"os/exec"
	"runtime"
)

// start starts cmd and returns the channel its end is sent on.
func start(cmd *exec.Cmd) (<-chan error, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return exited, nil
}

// terminate asks a child to stop; Windows has no signal for it, and the
// agent's state is safe from a kill.
func terminate(p *os.Process) {
	if runtime.GOOS == "windows" {
		p.Kill()
		return
	}
	p.Signal(os.Interrupt)
}
