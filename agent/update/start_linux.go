package update

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// start starts cmd so that it dies with the launcher (a launcher killed
// and started again must not find its old child still running), and
// returns the channel its end is sent on.
func start(cmd *exec.Cmd) (<-chan error, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started, exited := make(chan error, 1), make(chan error, 1)
	go func() {
		// The parent-death signal follows the thread that started the
		// child: that thread stays ours until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// terminate asks a child to stop.
func terminate(p *os.Process) { p.Signal(syscall.SIGTERM) }
