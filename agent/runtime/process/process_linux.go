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
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
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
	return d.limitPIDs(name, rec, []int{p.Pid})
}

// adopted puts every process of an adopted program (one a killed agent
// started, perhaps before it set its limits) in the workload's cgroups.
func (d *Driver) adopted(name string, rec record) error {
	var pids []int
	for _, p := range scan(func(u int) bool { return u == rec.UID }) {
		pids = append(pids, p.pid)
	}
	return d.limitPIDs(name, rec, pids)
}

func (d *Driver) limitPIDs(name string, rec record, pids []int) error {
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
		for _, pid := range pids {
			os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		}
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

// A workload's processes are found by its user ID: no other workload and
// no account of the box has it, and a workload cannot change it, so every
// process running as it is the workload's, however it was started and
// whatever session or process group it moved to.

// proc is one live process.
type proc struct {
	pid, sid int
	tick     int64
	uids     [4]int // real, effective, saved, filesystem
}

// scan returns the live processes (not zombies) any of whose user IDs
// keep says yes to.
func scan(keep func(uid int) bool) []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, ok := readProc(pid)
		if !ok {
			continue
		}
		for _, u := range p.uids {
			if keep(u) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

func readProc(pid int) (proc, bool) {
	p := proc{pid: pid}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return p, false
	}
	found := false
	for _, line := range strings.Split(string(st), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			for i := 0; i < len(f) && i < 4; i++ {
				p.uids[i], _ = strconv.Atoi(f[i])
			}
			found = len(f) >= 4
			break
		}
	}
	if !found {
		return p, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return p, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return p, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return p, false
	}
	p.sid, _ = strconv.Atoi(f[3])
	p.tick, _ = strconv.ParseInt(f[19], 10, 64)
	return p, true
}

// leader returns the program an instance's user runs as the leader of a
// session of its own, as Start starts it: the oldest, should a workload
// have started sessions of its own too.
func (d *Driver) leader(_ string, uid int) (run, bool) {
	if uid <= 0 {
		return run{}, false
	}
	var best proc
	for _, p := range scan(func(u int) bool { return u == uid }) {
		if p.pid == p.sid && (best.pid == 0 || p.tick < best.tick) {
			best = p
		}
	}
	if best.pid == 0 {
		return run{}, false
	}
	return run{PID: best.pid, StartTick: best.tick, StartedAt: tickTime(best.tick).UnixNano()}, true
}

// killAll ends every process running as uid and waits until none is
// left; it returns those it killed.
func (d *Driver) killAll(_ string, uid int) ([]int, error) {
	if uid <= 0 {
		return nil, nil
	}
	var killed []int
	seen := map[int]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps := scan(func(u int) bool { return u == uid })
		if len(ps) == 0 {
			return killed, nil
		}
		if time.Now().After(deadline) {
			return killed, fmt.Errorf("%d processes of user %d do not end", len(ps), uid)
		}
		for _, p := range ps {
			syscall.Kill(p.pid, syscall.SIGKILL)
			if !seen[p.pid] {
				seen[p.pid] = true
				killed = append(killed, p.pid)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// busyUIDs returns the user IDs of [first, first+n) that processes run
// as, with their pids.
func busyUIDs(first, n int) map[int][]int {
	in := func(u int) bool { return u >= first && u < first+n }
	out := map[int][]int{}
	for _, p := range scan(in) {
		seen := map[int]bool{}
		for _, u := range p.uids {
			if in(u) && !seen[u] {
				seen[u] = true
				out[u] = append(out[u], p.pid)
			}
		}
	}
	return out
}

// homeOwner returns the owner of a workload's home.
func homeOwner(home string) (int, bool) {
	fi, err := os.Stat(home)
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return 0, false
	}
	return int(st.Uid), true
}

// tickTime is when a process started, from its start time in clock ticks
// since boot (USER_HZ, 100 on Linux).
func tickTime(tick int64) time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Now()
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "btime "); ok {
			boot, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err == nil {
				return time.Unix(boot, 0).Add(time.Duration(tick) * time.Second / 100)
			}
		}
	}
	return time.Now()
}

// start and resume: a Linux program starts at once; its user ID makes it
// the workload's from its first instruction.
func start(cmd *exec.Cmd) error { return cmd.Start() }
func resume(*exec.Cmd) error    { return nil }

// sweepCgroups ends the workload users' processes in edgebox's cgroups of
// instances that do not exist, and removes those cgroups. The cgroups
// under edgebox/ are shared with containerd (its containers' are
// /edgebox/<id> too): only a cgroup holding processes of the driver's
// users is taken for the driver's, and only those processes are ended.
func (d *Driver) sweepCgroups(known map[string]bool) []runtime.Orphan {
	ours := func(u int) bool { return u >= d.cfg.FirstUID && u < d.cfg.FirstUID+uidRange }
	ctrls := []string{"memory", "cpu"}
	dirs := map[string][]string{} // instance -> its cgroups
	var names []string
	for _, ctrl := range ctrls {
		root := filepath.Join(d.cfg.CgroupRoot, ctrl, "edgebox")
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if e.IsDir() && !known[e.Name()] {
				if dirs[e.Name()] == nil {
					names = append(names, e.Name())
				}
				dirs[e.Name()] = append(dirs[e.Name()], filepath.Join(root, e.Name()))
			}
		}
	}
	var out []runtime.Orphan
	for _, name := range names {
		seen := map[int]bool{}
		var killed []int
		for range 1000 {
			n := 0
			for _, dir := range dirs[name] {
				b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
				for _, f := range strings.Fields(string(b)) {
					pid, err := strconv.Atoi(f)
					if err != nil {
						continue
					}
					if p, live := readProc(pid); !live || !ours(p.uids[0]) && !ours(p.uids[1]) {
						continue
					}
					n++
					syscall.Kill(pid, syscall.SIGKILL)
					if !seen[pid] {
						seen[pid] = true
						killed = append(killed, pid)
					}
				}
			}
			if n == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(killed) == 0 {
			continue // empty, or another runtime's
		}
		for _, dir := range dirs[name] {
			os.Remove(dir)
		}
		out = append(out, runtime.Orphan{Name: name, PIDs: killed, What: "processes in the cgroups of an instance that does not exist"})
	}
	return out
}

// workloadShell is the shell a session in a workload gets: the
// workload's user has no login entry, so no login shell.
func workloadShell() []string { return []string{"/bin/sh", "-i"} }
