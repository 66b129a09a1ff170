//go:build linux

package process

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// prepare makes the state directory and checks that workloads, running as
// other users, may pass through every directory above their homes.
func prepare(stateDir string) error {
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return err
	}
	if err := os.Chmod(stateDir, 0o711); err != nil {
		return err
	}
	for dir := stateDir; ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("process: workloads run as users of their own and cannot pass %s (mode %v); chmod o+x it", dir, fi.Mode().Perm())
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

func executable(fi os.FileInfo) bool { return fi.Mode()&0o111 != 0 }

func runnableByOthers(fi os.FileInfo) error {
	if fi.Mode()&0o001 == 0 {
		return errors.New("runs under a user of its own and must be executable by others (chmod o+rx)")
	}
	return nil
}

// makeHome gives the workload's user a home in the instance's directory,
// which stays the agent's.
func makeHome(dir string, uid int) error {
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	return os.Chown(home, uid, uid)
}

func baseEnv(home string) []string {
	return []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home}
}

// setUser starts cmd in a session of its own (apart from the agent's
// process group) as uid.
func setUser(cmd *exec.Cmd, uid int) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if uid > 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), NoSetGroups: true}
	}
}

func exitCode(st *os.ProcessState) int {
	if st == nil {
		return -1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

func (d *Driver) terminate(_ string, r run) { syscall.Kill(-r.PID, syscall.SIGTERM) }
func (d *Driver) kill(_ string, r run)      { syscall.Kill(-r.PID, syscall.SIGKILL) }

// startTick is the kernel's start time of pid (clock ticks since boot).
func startTick(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces and parentheses: fields count from
	// the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" {
		return 0, false // gone, or a zombie
	}
	n, err := strconv.ParseInt(f[19], 10, 64)
	return n, err == nil
}

// alive reports whether r's program still runs.
func alive(r run) bool {
	if r.PID <= 0 {
		return false
	}
	tick, ok := startTick(r.PID)
	return ok && tick == r.StartTick
}

// limit puts pid in cgroups with the workload's CPU and memory limits,
// where the controllers are mounted.
func (d *Driver) limit(name string, rec record, p *os.Process) error {
	pid := p.Pid
	put := func(ctrl string, files map[string]string) {
		dir := filepath.Join(d.cfg.CgroupRoot, ctrl, "edgebox", name)
		if _, err := os.Stat(filepath.Join(d.cfg.CgroupRoot, ctrl)); err != nil {
			return
		}
		if os.MkdirAll(dir, 0o755) != nil {
			return
		}
		for f, v := range files {
			os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644)
		}
		os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
	}
	if rec.Mem > 0 {
		put("memory", map[string]string{"memory.limit_in_bytes": strconv.FormatInt(rec.Mem, 10)})
	}
	if rec.CPU > 0 {
		put("cpu", map[string]string{"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": strconv.FormatInt(rec.CPU*100, 10)})
	}
	return nil
}

// unlimit removes the workload's cgroups.
func (d *Driver) unlimit(name string) {
	for _, ctrl := range []string{"memory", "cpu"} {
		os.Remove(filepath.Join(d.cfg.CgroupRoot, ctrl, "edgebox", name))
	}
}

// grantDevices gives the workload's user its leased keys' device nodes.
func grantDevices(rec record) error {
	for _, p := range rec.Devices {
		if err := os.Chown(p, rec.UID, -1); err != nil {
			return err
		}
	}
	return nil
}

// revokeDevices gives the device nodes back to root.
func revokeDevices(rec record) {
	for _, p := range rec.Devices {
		os.Chown(p, 0, -1)
	}
}
