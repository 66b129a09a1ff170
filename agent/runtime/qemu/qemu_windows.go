package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/windows"
)

// defaultAccel is WHPX (Windows Hypervisor Platform) where Windows has it
// turned on, and TCG where not: QEMU takes the first that works.
func defaultAccel() string { return "whpx:tcg" }

// launch starts QEMU detached from the agent (QEMU has no -daemonize on
// Windows) and waits for its pid file; its complaints go to qemu.err.
// started runs once QEMU's process exists; an error from it returns at
// once, leaving QEMU to come up on its own (crash tests).
func launch(ctx context.Context, binary string, args []string, dir string, _ []*os.File, running func() bool, started func() error) error {
	errPath := filepath.Join(dir, "qemu.err")
	errFile, err := os.Create(errPath)
	if err != nil {
		return err
	}
	defer errFile.Close()
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = errFile, errFile
	cmd.SysProcAttr = &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP | windows.DETACHED_PROCESS}
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := started(); err != nil {
		go cmd.Wait()
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if running() {
			return nil
		}
		select {
		case <-exited:
			msg, _ := os.ReadFile(errPath)
			return fmt.Errorf("QEMU exited at once: %s", strings.TrimSpace(string(msg)))
		case <-deadline.C:
			cmd.Process.Kill()
			return fmt.Errorf("QEMU did not come up in 30 s")
		case <-ctx.Done():
			cmd.Process.Kill()
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// isQEMU says whether pid is a running QEMU.
func isQEMU(pid int, _ string) bool {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return false
	}
	defer windows.CloseHandle(h)
	var code uint32
	if windows.GetExitCodeProcess(h, &code) != nil || code != 259 { // STILL_ACTIVE
		return false
	}
	buf := make([]uint16, windows.MAX_PATH)
	n := uint32(len(buf))
	if windows.QueryFullProcessImageName(h, 0, &buf[0], &n) != nil {
		return false
	}
	return strings.Contains(strings.ToLower(windows.UTF16ToString(buf[:n])), "qemu")
}

// qemus: Windows cannot tell a QEMU by its command line from here; VMs
// are found by their pid files only.
func qemus(string) map[string][]int { return map[string][]int{} }

func killPID(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}
