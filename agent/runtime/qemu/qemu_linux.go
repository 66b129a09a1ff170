package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
// VM is set up, or with QEMU's complaint. QEMU gets files from fd 3 on. started runs once QEMU's
// process exists; an error from it returns at once, leaving QEMU to come
// up on its own (crash tests).
func launch(ctx context.Context, binary string, args []string, _ string, files []*os.File, running func() bool, started func() error) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, append(args, "-daemonize")...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.ExtraFiles = files // from fd 3: the tap of a bridged VM
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := started(); err != nil {
		go cmd.Wait() // the daemonizing parent ends on its own
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(out.String()))
	}
	if !running() {
		return fmt.Errorf("QEMU exited at once: %s", strings.TrimSpace(out.String()))
	}
	return nil
}

// pidfileArg is how a VM's QEMU names its pid file on its command line:
// the mark by which it is found without the pid file, which QEMU writes
// only once it is set up.
func pidfileArg(vmDir string) []byte {
	return []byte("\x00-pidfile\x00" + filepath.Join(vmDir, "qemu.pid") + "\x00")
}

// isQEMU says whether pid is the QEMU of the VM in vmDir.
func isQEMU(pid int, vmDir string) bool {
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmd, pidfileArg(vmDir)) && !zombie(pid)
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

// qemus returns the live QEMU processes of the VMs under vmsDir, by the
// directory of each: those whose pid file has not been written yet, and
// those whose VM is gone, too.
func qemus(vmsDir string) map[string][]int {
	out := map[string][]int{}
	prefix := []byte("\x00-pidfile\x00" + vmsDir + string(filepath.Separator))
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		i := bytes.Index(cmd, prefix)
		if i < 0 || zombie(pid) {
			continue
		}
		rest := cmd[i+len(prefix):]
		if j := bytes.IndexByte(rest, 0); j >= 0 {
			rest = rest[:j]
		}
		dir := filepath.Join(vmsDir, filepath.Dir(string(rest)))
		out[dir] = append(out[dir], pid)
	}
	return out
}

func killPID(pid int) { syscall.Kill(pid, syscall.SIGKILL) }
