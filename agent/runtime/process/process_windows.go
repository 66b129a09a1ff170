//go:build windows

package process

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"

	"github.com/edgebox/edgebox/agent/runtime"
)

// prepare makes the state directory.
func prepare(stateDir string) error { return os.MkdirAll(stateDir, 0o700) }

// executable: Windows runs programs by extension.
func executable(fi os.FileInfo) bool {
	switch strings.ToLower(filepath.Ext(fi.Name())) {
	case ".exe", ".com", ".bat", ".cmd":
		return true
	}
	return false
}

// runnableByOthers: workloads run under the agent's account on Windows.
func runnableByOthers(os.FileInfo) error { return nil }

func makeHome(dir string, _ int) error { return os.MkdirAll(filepath.Join(dir, "home"), 0o700) }

// baseEnv is what Windows programs need of an environment, with the
// workload's home as its profile and temporary directory.
func baseEnv(home string) []string {
	env := []string{"USERPROFILE=" + home, "TEMP=" + home, "TMP=" + home}
	for _, k := range []string{"SystemRoot", "SystemDrive", "windir", "ComSpec", "PATHEXT", "PROGRAMDATA", "ProgramFiles", "PATH"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// setUser starts cmd in a process group of its own, which CTRL_BREAK can
// reach; it runs under the agent's account.
func setUser(cmd *exec.Cmd, _ int) {
	cmd.SysProcAttr = &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP}
}

func exitCode(st *os.ProcessState) int {
	if st == nil {
		return -1
	}
	return st.ExitCode()
}

// startTick is the process's creation time, which a reused pid does not
// share.
func startTick(pid int) (int64, bool) {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return 0, false
	}
	defer windows.CloseHandle(h)
	var created, exited, kernel, user windows.Filetime
	if err := windows.GetProcessTimes(h, &created, &exited, &kernel, &user); err != nil {
		return 0, false
	}
	return created.Nanoseconds(), true
}

// stillActive is GetExitCodeProcess's answer for a running process.
const stillActive = 259

// alive reports whether r's program still runs.
func alive(r run) bool {
	if r.PID <= 0 {
		return false
	}
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(r.PID))
	if err != nil {
		return false
	}
	defer windows.CloseHandle(h)
	var code uint32
	if windows.GetExitCodeProcess(h, &code) != nil || code != stillActive {
		return false
	}
	tick, ok := startTick(r.PID)
	return ok && tick == r.StartTick
}

// jobName names a workload's job object; the agent finds it again by name
// after a restart.
func jobName(name string) *uint16 {
	p, _ := windows.UTF16PtrFromString(`Local\edgebox-` + name)
	return p
}

// cpuRateControl is JOBOBJECT_CPU_RATE_CONTROL_INFORMATION.
type cpuRateControl struct {
	ControlFlags uint32
	CpuRate      uint32
}

const (
	jobObjectCpuRateControlInformation = 15
	cpuRateControlEnable               = 0x1
	cpuRateControlHardCap              = 0x4
)

// limit puts the program in the workload's job object, with its memory
// and CPU limits.
func (d *Driver) limit(name string, rec record, p *os.Process) error {
	job, err := windows.CreateJobObject(nil, jobName(name))
	if err != nil {
		return err
	}
	var info windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
	if rec.Mem > 0 {
		info.BasicLimitInformation.LimitFlags |= windows.JOB_OBJECT_LIMIT_JOB_MEMORY
		info.JobMemoryLimit = uintptr(rec.Mem)
	}
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		windows.CloseHandle(job)
		return err
	}
	if rec.CPU > 0 {
		rate := cpuRateControl{ControlFlags: cpuRateControlEnable | cpuRateControlHardCap, CpuRate: cpuRate(rec.CPU, goruntime.NumCPU())}
		if _, err := windows.SetInformationJobObject(job, jobObjectCpuRateControlInformation,
			uintptr(unsafe.Pointer(&rate)), uint32(unsafe.Sizeof(rate))); err != nil {
			windows.CloseHandle(job)
			return err
		}
	}
	h, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(p.Pid))
	if err != nil {
		windows.CloseHandle(job)
		return err
	}
	defer windows.CloseHandle(h)
	if err := windows.AssignProcessToJobObject(job, h); err != nil {
		windows.CloseHandle(job)
		return err
	}
	// The job lives on while its processes do; the agent need not hold it.
	return windows.CloseHandle(job)
}

func (d *Driver) unlimit(string) {}

// adopted: a program is found by its job, which carries its limits.
func (d *Driver) adopted(string, record) error { return nil }

// terminate asks the program to end with CTRL_BREAK; a program without a
// console to receive it is ended with its job at once.
func (d *Driver) terminate(name string, r run) {
	if err := windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, uint32(r.PID)); err != nil {
		d.kill(name, r)
	}
}

// kill ends the workload's whole job: the program and everything it
// started.
func (d *Driver) kill(name string, r run) {
	// Creating a job of an existing name opens it.
	job, err := windows.CreateJobObject(nil, jobName(name))
	if err == nil {
		defer windows.CloseHandle(job)
		if windows.TerminateJobObject(job, 1) == nil {
			return
		}
	}
	if p, err := os.FindProcess(r.PID); err == nil {
		p.Kill()
	}
}

// grantDevices: on Windows a workload reaches its keys under the agent's
// account.
func grantDevices(record) error { return nil }
func revokeDevices(record)      {}

// A workload's processes are found by its job object, named for it: every
// process the program starts is in it (Start assigns the program while it
// is still suspended, before it runs an instruction).

// jobIDs are the processes in the workload's job.
func jobIDs(name string) []int {
	if name == "" {
		return nil
	}
	job, err := windows.CreateJobObject(nil, jobName(name))
	if err != nil {
		return nil
	}
	defer windows.CloseHandle(job)
	var list struct {
		Assigned, InList uint32
		IDs              [1024]uintptr
	}
	if err := windows.QueryInformationJobObject(job, windows.JobObjectBasicProcessIdList,
		uintptr(unsafe.Pointer(&list)), uint32(unsafe.Sizeof(list)), nil); err != nil {
		return nil
	}
	var out []int
	for i := uint32(0); i < list.InList && int(i) < len(list.IDs); i++ {
		out = append(out, int(list.IDs[i]))
	}
	return out
}

// leader returns the oldest process of the workload's job.
func (d *Driver) leader(name string, _ int) (run, bool) {
	var best run
	for _, pid := range jobIDs(name) {
		tick, ok := startTick(pid)
		if ok && (best.PID == 0 || tick < best.StartTick) {
			best = run{PID: pid, StartTick: tick, StartedAt: tick}
		}
	}
	return best, best.PID != 0
}

// killAll ends the workload's whole job and waits until it is empty.
func (d *Driver) killAll(name string, _ int) ([]int, error) {
	pids := jobIDs(name)
	if len(pids) == 0 {
		return nil, nil
	}
	d.kill(name, run{})
	deadline := time.Now().Add(30 * time.Second)
	for len(jobIDs(name)) > 0 {
		if time.Now().After(deadline) {
			return pids, fmt.Errorf("the job of %s does not end", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return pids, nil
}

// Workloads run under the agent's account on Windows: no user IDs.
func busyUIDs(int, int) map[int][]int { return map[int][]int{} }
func homeOwner(string) (int, bool)    { return 0, false }

func (d *Driver) sweepCgroups(map[string]bool) []runtime.Orphan { return nil }

// start starts the program suspended; resume lets it run once it is in
// its job, so nothing it starts escapes the job.
func start(cmd *exec.Cmd) error {
	cmd.SysProcAttr.CreationFlags |= windows.CREATE_SUSPENDED
	return cmd.Start()
}

var ntResumeProcess = windows.NewLazySystemDLL("ntdll.dll").NewProc("NtResumeProcess")

func resume(cmd *exec.Cmd) error {
	h, err := windows.OpenProcess(windows.PROCESS_SUSPEND_RESUME, false, uint32(cmd.Process.Pid))
	if err != nil {
		return err
	}
	defer windows.CloseHandle(h)
	if st, _, _ := ntResumeProcess.Call(uintptr(h)); st != 0 {
		return fmt.Errorf("NtResumeProcess: status %#x", st)
	}
	return nil
}

// workloadShell is the shell a session in a workload gets.
func workloadShell() []string {
	if c := os.Getenv("ComSpec"); c != "" {
		return []string{c}
	}
	return []string{"cmd.exe"}
}
