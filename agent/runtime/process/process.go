// Package process is the runtime.Driver for native programs: the
// workload's image is the path of an executable on the box, started apart
// from the agent with its output in a log file. Instances outlive the
// agent; their state is in files, so a restarted agent finds them again.
//
// On Linux each program runs in a session of its own, under a user ID of
// its own (no other workload and no account of the box has it) with a home
// of its own, and with CPU and memory limits from cgroup v1 controllers
// where the box has them. On Windows each program runs in a job object
// named for it that carries its CPU and memory limits and ends the whole
// process tree at once; it runs under the agent's account.
package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/atomicfile"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Config says where the driver keeps its instances.
type Config struct {
	// StateDir holds a directory per instance: its spec, pid, exit code
	// and log.
	StateDir string
	// CgroupRoot is the cgroup v1 mount, /sys/fs/cgroup unless set; limits
	// are skipped for controllers it lacks.
	CgroupRoot string
	// FirstUID is the first of the 10,000 user IDs workloads run as;
	// default 690000, far above the accounts of a box.
	FirstUID int
	// Log takes what the driver does on its own (adopting a program a
	// killed agent started, clearing a half-made instance); nil discards.
	Log *slog.Logger
	// Crash is for crash-point tests; production leaves it nil.
	Crash runtime.CrashHook
	// AgentAPI is the agent's local API address, given to every program
	// as EDGEBOX_AGENT_API; empty gives none.
	AgentAPI string
}

// crashPoints are the steps of the driver's operations between which a
// killed agent leaves something behind.
var crashPoints = []string{
	"create/home", "create/spec",
	"start/intent", "start/started", "start/limited",
	"stop/signalled",
	"remove/stopped", "remove/released", "remove/renamed",
}

// CrashPoints lists where a crash hook is called.
func (d *Driver) CrashPoints() []string { return crashPoints }

func (d *Driver) at(point string) error { return d.cfg.Crash.At(crashPoints, point) }

// uidRange is how many user IDs the driver hands out.
const uidRange = 10000

// Driver runs native programs.
type Driver struct {
	cfg Config
	mu  sync.Mutex // serialises changes to instances; guards reaped
	// reaped has, for each program this driver started, a channel closed
	// once its exit code is on disk.
	reaped map[string]chan struct{}
}

// New returns a driver keeping its state in cfg.StateDir.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("process: StateDir is required")
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	if cfg.FirstUID <= 0 {
		cfg.FirstUID = 690000
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := prepare(cfg.StateDir); err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg, reaped: map[string]chan struct{}{}}, nil
}

func (d *Driver) Runtime() string { return edgeboxv1.RuntimeProcess }

// record is an instance's spec on disk.
type record struct {
	Name string   `json:"name"`
	Hash string   `json:"hash"`
	Path string   `json:"path"`
	Args []string `json:"args,omitempty"`
	Env  []string `json:"env,omitempty"`
	CPU  int64    `json:"cpu_millis,omitempty"`
	Mem  int64    `json:"memory_bytes,omitempty"`
	UID  int      `json:"uid"`
	// Devices are the host device nodes of its leased USB keys.
	Devices []string `json:"devices,omitempty"`
}

// run is a started program: its pid and the kernel's start time of that
// pid, so a reused pid is not taken for it. Start writes it twice: with
// Starting set before the program starts, and with its pid after, so a
// restarted agent knows a start it did not see the end of, and adopts the
// program it finds running as the instance's user instead of starting a
// second copy.
type run struct {
	PID       int   `json:"pid"`
	StartTick int64 `json:"start_tick"`
	StartedAt int64 `json:"started_at"`
	Starting  bool  `json:"starting,omitempty"`
}

// On disk, under StateDir:
//
//	<name>/            spec.json, run.json, exit, output.log, home/
//	.new-<name>-*/     an instance being made: renamed to <name> whole
//	.rm-<name>-*/      an instance being deleted, its programs ended
//
// An instance is visible only with its spec.json, which is in place
// before its directory gets its name; a killed agent leaves the dot
// directories, which the sweep clears.
func (d *Driver) dir(name string) string { return filepath.Join(d.cfg.StateDir, name) }

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func (d *Driver) load(name string) (record, error) {
	var r record
	err := readJSON(filepath.Join(d.dir(name), "spec.json"), &r)
	if errors.Is(err, os.ErrNotExist) {
		return r, errdefs.NotFound("no instance %s", name)
	}
	return r, err
}

// Create records the instance; the program must exist. A directory of
// the instance's name without a spec.json is a half-made instance (an
// agent killed while making it, or an older agent's leftover): Create
// ends whatever of it runs and makes the instance anew.
func (d *Driver) Create(_ context.Context, s runtime.Spec) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := s.Workload
	if !filepath.IsAbs(w.GetImage()) {
		return errdefs.Invalid("process workload %s: image must be the absolute path of a program on the box, not %q", s.Name, w.GetImage())
	}
	if fi, err := os.Stat(w.GetImage()); err != nil || fi.IsDir() || !executable(fi) {
		return errdefs.NotFound("process workload %s: %s is not an executable program on this box", s.Name, w.GetImage())
	} else if err := runnableByOthers(fi); err != nil {
		return errdefs.Invalid("process workload %s: %s %w", s.Name, w.GetImage(), err)
	}
	if s.Name == "" || strings.ContainsAny(s.Name, `/\`) || strings.HasPrefix(s.Name, ".") {
		return errdefs.Invalid("process workload %q: not a name for an instance", s.Name)
	}
	if _, err := os.Stat(d.dir(s.Name)); err == nil {
		if _, err := d.load(s.Name); !errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.Conflict("instance %s exists", s.Name)
		}
		d.cfg.Log.Warn("replacing a half-made instance", "instance", s.Name)
		if err := d.discard(s.Name, d.dir(s.Name)); err != nil {
			return fmt.Errorf("clearing the half-made instance %s: %w", s.Name, err)
		}
	}
	uid, err := d.freeUID()
	if err != nil {
		return err
	}
	staging, err := os.MkdirTemp(d.cfg.StateDir, ".new-"+s.Name+"-")
	if err != nil {
		return err
	}
	if err := makeHome(staging, uid); err != nil {
		os.RemoveAll(staging)
		return err
	}
	if err := d.at("create/home"); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(staging, "spec.json"), record{Name: s.Name, Hash: s.Hash, Path: w.GetImage(),
		Args: w.GetArgs(), Env: w.GetEnv(), CPU: w.GetCpuMillis(), Mem: w.GetMemoryBytes(), UID: uid, Devices: hostPaths(s.Devices)}); err != nil {
		os.RemoveAll(staging)
		return err
	}
	if err := d.at("create/spec"); err != nil {
		return err
	}
	if err := os.Rename(staging, d.dir(s.Name)); err != nil {
		os.RemoveAll(staging)
		return err
	}
	return nil
}

// discard ends every program of the instance whose directory is dir and
// deletes the directory: renamed aside first, so a crash part way leaves
// no instance half there. Hold d.mu.
func (d *Driver) discard(name, dir string) error {
	uid, _ := d.owner(dir)
	if _, err := d.killAll(name, uid); err != nil {
		return err
	}
	gone := dir
	if base := filepath.Base(dir); !strings.HasPrefix(base, ".") {
		gone = filepath.Join(d.cfg.StateDir, fmt.Sprintf(".rm-%s-%d", base, time.Now().UnixNano()))
		if err := os.Rename(dir, gone); err != nil {
			return err
		}
		if err := d.at("remove/renamed"); err != nil {
			return err
		}
	}
	return os.RemoveAll(gone)
}

// owner returns the user ID of the instance in dir: its spec's, or, for
// one half made, its home's owner.
func (d *Driver) owner(dir string) (int, bool) {
	var r record
	if readJSON(filepath.Join(dir, "spec.json"), &r) == nil && r.UID > 0 {
		return r.UID, true
	}
	return homeOwner(filepath.Join(dir, "home"))
}

func hostPaths(devs []runtime.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.HostPath)
	}
	return out
}

func (d *Driver) current(name string) (run, bool) {
	var r run
	if readJSON(filepath.Join(d.dir(name), "run.json"), &r) != nil {
		return r, false
	}
	return r, true
}

// program returns the instance's running program: the one its run record
// names, or, when the record is missing or a start's intent (an agent was
// killed while starting it), the program found running as the instance.
func (d *Driver) program(name string, rec record) (run, bool) {
	r, ok := d.current(name)
	if ok && !r.Starting {
		return r, alive(r)
	}
	return d.leader(name, rec.UID)
}

// Start starts the program unless it runs. A program a killed agent
// started is adopted, not started again; what is left of an ended run
// (programs it started that outlived it) is ended first, so two copies
// never run.
func (d *Driver) Start(_ context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	rec, err := d.load(name)
	if err != nil {
		return err
	}
	r, ok := d.current(name)
	if ok && !r.Starting && alive(r) {
		return nil
	}
	if !ok || r.Starting {
		if l, found := d.leader(name, rec.UID); found {
			d.cfg.Log.Info("adopting a program a killed agent started", "instance", name, "pid", l.PID)
			if err := d.adopted(name, rec); err != nil {
				return fmt.Errorf("limits of %s: %w", name, err)
			}
			return writeJSON(filepath.Join(d.dir(name), "run.json"), l)
		}
	}
	if pids, err := d.killAll(name, rec.UID); err != nil {
		return fmt.Errorf("ending what is left of %s's last run: %w", name, err)
	} else if len(pids) > 0 {
		d.cfg.Log.Warn("ended what was left of an instance's last run", "instance", name, "pids", pids)
	}
	if err := writeJSON(filepath.Join(d.dir(name), "run.json"), run{Starting: true, StartedAt: time.Now().UnixNano()}); err != nil {
		return err
	}
	if err := d.at("start/intent"); err != nil {
		return err
	}
	log, err := os.OpenFile(filepath.Join(d.dir(name), "output.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	home := filepath.Join(d.dir(name), "home")
	cmd := exec.Command(rec.Path, rec.Args...)
	cmd.Env = append(baseEnv(home), rec.Env...)
	if d.cfg.AgentAPI != "" {
		cmd.Env = append(cmd.Env, runtime.AgentAPIEnv+"="+d.cfg.AgentAPI)
	}
	cmd.Dir = home
	cmd.Stdout, cmd.Stderr = log, log
	setUser(cmd, rec.UID)
	os.Remove(filepath.Join(d.dir(name), "exit"))
	if err := grantDevices(rec); err != nil {
		return fmt.Errorf("keys of %s: %w", name, err)
	}
	if err := start(cmd); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	if err := d.at("start/started"); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	err = d.limit(name, rec, cmd.Process)
	if err == nil {
		err = resume(cmd)
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("limits of %s: %w", name, err)
	}
	if err := d.at("start/limited"); err != nil {
		return err
	}
	tick, _ := startTick(pid)
	if err := writeJSON(filepath.Join(d.dir(name), "run.json"), run{PID: pid, StartTick: tick, StartedAt: time.Now().UnixNano()}); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	// Reap it and keep its exit code, while this agent lives. The
	// goroutine ends with the program.
	done := make(chan struct{})
	d.reaped[name] = done
	go func() {
		defer close(done)
		cmd.Wait()
		code := exitCode(cmd.ProcessState)
		os.WriteFile(filepath.Join(d.dir(name), "exit"), []byte(strconv.Itoa(code)), 0o600)
	}()
	return nil
}

// Stop asks the program to end (Linux: SIGTERM to its process group) and
// ends it after timeout (SIGKILL; Windows: the whole job at once); then
// it ends whatever else runs as the instance.
func (d *Driver) Stop(ctx context.Context, name string, timeout time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	rec, err := d.load(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if r, running := d.program(name, rec); running {
		d.terminate(name, r)
		if err := d.at("stop/signalled"); err != nil {
			return err
		}
		deadline := time.Now().Add(timeout)
		for alive(r) {
			if time.Now().After(deadline) {
				d.kill(name, r)
				deadline = time.Now().Add(time.Hour)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		if cur, ok := d.current(name); !ok || cur.Starting {
			// An adopted program: keep that it ran.
			writeJSON(filepath.Join(d.dir(name), "run.json"), r)
		}
	}
	if pids, err := d.killAll(name, rec.UID); err != nil {
		return fmt.Errorf("stopping %s: %w", name, err)
	} else if len(pids) > 0 {
		d.cfg.Log.Info("ended the programs an instance's program left running", "instance", name, "pids", pids)
	}
	d.waitReaped(name)
	return nil
}

// waitReaped waits for the exit code of a program this driver started,
// which has ended. Hold d.mu.
func (d *Driver) waitReaped(name string) {
	if done, ok := d.reaped[name]; ok {
		select {
		case <-done:
			delete(d.reaped, name)
		case <-time.After(5 * time.Second):
		}
	}
}

// Remove stops the program, ends every process of the instance, and
// forgets it, its log and its limits.
func (d *Driver) Remove(ctx context.Context, name string) error {
	if err := d.Stop(ctx, name, 10*time.Second); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.at("remove/stopped"); err != nil {
		return err
	}
	d.waitReaped(name)
	if _, err := os.Stat(d.dir(name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	uid, _ := d.owner(d.dir(name))
	if _, err := d.killAll(name, uid); err != nil {
		return fmt.Errorf("removing %s: %w", name, err)
	}
	d.unlimit(name)
	if rec, err := d.load(name); err == nil {
		revokeDevices(rec)
	}
	if err := d.at("remove/released"); err != nil {
		return err
	}
	return d.discard(name, d.dir(name))
}

// List returns the driver's instances.
func (d *Driver) List(ctx context.Context) ([]runtime.Instance, error) {
	entries, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var out []runtime.Instance
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		in, err := d.Inspect(ctx, e.Name())
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // half made: Create replaces it, the sweep clears it
		} else if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

// Inspect returns one instance.
func (d *Driver) Inspect(_ context.Context, name string) (runtime.Instance, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || strings.HasPrefix(name, ".") {
		return runtime.Instance{}, errdefs.NotFound("no instance %q", name)
	}
	rec, err := d.load(name)
	if err != nil {
		return runtime.Instance{}, err
	}
	in := runtime.Instance{Name: name, Hash: rec.Hash, State: runtime.StateCreated}
	r, running := d.program(name, rec)
	if running {
		in.State, in.StartedAt = runtime.StateRunning, time.Unix(0, r.StartedAt)
		return in, nil
	}
	if cur, ok := d.current(name); !ok || cur.Starting {
		return in, nil // never started, or a start that did not happen
	}
	in.StartedAt = time.Unix(0, r.StartedAt)
	in.State, in.ExitCode = runtime.StateExited, -1 // ended while no agent watched it
	if b, err := os.ReadFile(filepath.Join(d.dir(name), "exit")); err == nil {
		if n, err := strconv.Atoi(string(b)); err == nil {
			in.ExitCode = n
		}
	}
	return in, nil
}

// Logs writes the last tail lines of the program's output.
func (d *Driver) Logs(_ context.Context, name string, tail int, w io.Writer) error {
	if _, err := d.load(name); err != nil {
		return err
	}
	return runtime.TailFile(filepath.Join(d.dir(name), "output.log"), tail, w)
}

// freeUID returns the lowest user ID of the range that no instance, whole
// or half made or half deleted, holds and that no process runs as: a user
// ID is never handed out while anything of its last owner lives. Hold
// d.mu.
func (d *Driver) freeUID() (int, error) {
	used := busyUIDs(d.cfg.FirstUID, uidRange)
	ents, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		if uid, ok := d.owner(filepath.Join(d.cfg.StateDir, e.Name())); ok {
			used[uid] = append(used[uid], 0)
		}
	}
	for uid := d.cfg.FirstUID; uid < d.cfg.FirstUID+uidRange; uid++ {
		if _, ok := used[uid]; !ok {
			return uid, nil
		}
	}
	return 0, errdefs.Unavailable("all %d workload user IDs are taken", uidRange)
}

var (
	_ runtime.Sweeper      = (*Driver)(nil)
	_ runtime.CrashPointer = (*Driver)(nil)
)

// Sweep ends every process that runs as a workload user no instance
// holds, and clears what killed agents left: half-made instances (no
// spec.json) and the directories of instances being made or deleted.
func (d *Driver) Sweep(_ context.Context) ([]runtime.Orphan, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ents, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var out []runtime.Orphan
	owners := map[int]string{}
	known := map[string]bool{}
	for _, e := range ents {
		name, dir := e.Name(), filepath.Join(d.cfg.StateDir, e.Name())
		if !e.IsDir() {
			continue
		}
		if !strings.HasPrefix(name, ".") {
			if rec, err := d.load(name); err == nil {
				owners[rec.UID], known[name] = name, true
				continue
			}
		}
		// Half made, or being made or deleted when an agent was killed.
		uid, _ := d.owner(dir)
		pids, err := d.killAll(name, uid)
		if err != nil {
			return out, err
		}
		if err := d.discard(name, dir); err != nil {
			return out, err
		}
		out = append(out, runtime.Orphan{Name: instanceOf(name), PIDs: pids,
			What: fmt.Sprintf("what a killed agent left of an instance (%s)", name)})
	}
	// Cgroups first: what is found there names its instance.
	out = append(out, d.sweepCgroups(known)...)
	for uid, pids := range busyUIDs(d.cfg.FirstUID, uidRange) {
		if _, ok := owners[uid]; ok {
			continue
		}
		killed, err := d.killAll("", uid)
		if err != nil {
			return out, err
		}
		if len(killed) == 0 {
			killed = pids
		}
		out = append(out, runtime.Orphan{PIDs: killed, What: fmt.Sprintf("processes of workload user %d, which no instance holds", uid)})
	}
	for _, o := range out {
		d.cfg.Log.Warn("stopped an orphan", "instance", o.Name, "pids", o.PIDs, "what", o.What)
	}
	return out, nil
}

// instanceOf is the instance a directory under StateDir was made for:
// .new-<name>-<suffix> and .rm-<name>-<suffix> are of <name>.
func instanceOf(dir string) string {
	for _, p := range []string{".new-", ".rm-"} {
		if rest, ok := strings.CutPrefix(dir, p); ok {
			if i := strings.LastIndexByte(rest, '-'); i > 0 {
				return rest[:i]
			}
			return rest
		}
	}
	return dir
}

// cpuRate is a CPU limit in thousandths of a CPU as a Windows job's CPU
// rate: hundredths of a percent of all the box's CPUs, 1 to 10000.
func cpuRate(millis int64, cpus int) uint32 {
	if cpus < 1 {
		cpus = 1
	}
	r := millis * 10000 / (int64(cpus) * 1000)
	return uint32(min(max(r, 1), 10000))
}
