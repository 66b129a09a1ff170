package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// defaultAccel is KVM when this box has it, TCG otherwise.
func defaultAccel() string {
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		return "kvm"
	}
	return "tcg"
}

// launch starts QEMU detached from the agent: -daemonize returns once the
// VM is set up, or with QEMU's complaint.
func launch(ctx context.Context, binary string, args []string, _ string, running func() bool) error {
	out, err := exec.CommandContext(ctx, binary, append(args, "-daemonize")...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	if !running() {
		return fmt.Errorf("QEMU exited at once: %s", strings.TrimSpace(string(out)))
	}
	return nil
}

// isQEMU says whether pid is the QEMU of the VM in vmDir.
func isQEMU(pid int, vmDir string) bool {
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmd), vmDir)
}

func killPID(pid int) { syscall.Kill(pid, syscall.SIGKILL) }
