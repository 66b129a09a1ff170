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
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/atomicfile"
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
}

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
	if err := prepare(cfg.StateDir); err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg, reaped: map[string]chan struct{}{}}, nil
}

func (d *Driver) Runtime() string { return "process" }

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
// pid, so a reused pid is not taken for it.
type run struct {
	PID       int   `json:"pid"`
	StartTick int64 `json:"start_tick"`
	StartedAt int64 `json:"started_at"`
}

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

// Create records the instance; the program must exist.
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
		return errdefs.Invalid("process workload %s: %s %v", s.Name, w.GetImage(), err)
	}
	if _, err := os.Stat(d.dir(s.Name)); err == nil {
		return errdefs.Conflict("instance %s exists", s.Name)
	}
	uid, err := d.freeUID()
	if err != nil {
		return err
	}
	if err := makeHome(d.dir(s.Name), uid); err != nil {
		return err
	}
	return writeJSON(filepath.Join(d.dir(s.Name), "spec.json"), record{Name: s.Name, Hash: s.Hash, Path: w.GetImage(),
		Args: w.GetArgs(), Env: w.GetEnv(), CPU: w.GetCpuMillis(), Mem: w.GetMemoryBytes(), UID: uid, Devices: hostPaths(s.Devices)})
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

// Start starts the program unless it runs.
func (d *Driver) Start(_ context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	rec, err := d.load(name)
	if err != nil {
		return err
	}
	if r, ok := d.current(name); ok && alive(r) {
		return nil
	}
	log, err := os.OpenFile(filepath.Join(d.dir(name), "output.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	home := filepath.Join(d.dir(name), "home")
	cmd := exec.Command(rec.Path, rec.Args...)
	cmd.Env = append(baseEnv(home), rec.Env...)
	cmd.Dir = home
	cmd.Stdout, cmd.Stderr = log, log
	setUser(cmd, rec.UID)
	os.Remove(filepath.Join(d.dir(name), "exit"))
	if err := grantDevices(rec); err != nil {
		return fmt.Errorf("keys of %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	if err := d.limit(name, rec, cmd.Process); err != nil {
		cmd.Process.Kill()
		return fmt.Errorf("limits of %s: %w", name, err)
	}
	tick, _ := startTick(pid)
	if err := writeJSON(filepath.Join(d.dir(name), "run.json"), run{PID: pid, StartTick: tick, StartedAt: time.Now().UnixNano()}); err != nil {
		cmd.Process.Kill()
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
// ends it after timeout (SIGKILL; Windows: the whole job at once).
func (d *Driver) Stop(ctx context.Context, name string, timeout time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.load(name); errors.Is(err, errdefs.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	r, ok := d.current(name)
	if !ok || !alive(r) {
		return nil
	}
	d.terminate(name, r)
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

// Remove stops the program and forgets it, its log and its limits.
func (d *Driver) Remove(ctx context.Context, name string) error {
	if err := d.Stop(ctx, name, 10*time.Second); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.waitReaped(name)
	d.unlimit(name)
	if rec, err := d.load(name); err == nil {
		revokeDevices(rec)
	}
	return os.RemoveAll(d.dir(name))
}

// List returns the driver's instances.
func (d *Driver) List(ctx context.Context) ([]runtime.Instance, error) {
	entries, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var out []runtime.Instance
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		in, err := d.Inspect(ctx, e.Name())
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

// Inspect returns one instance.
func (d *Driver) Inspect(_ context.Context, name string) (runtime.Instance, error) {
	rec, err := d.load(name)
	if err != nil {
		return runtime.Instance{}, err
	}
	in := runtime.Instance{Name: name, Hash: rec.Hash, State: runtime.StateCreated}
	r, ok := d.current(name)
	if !ok {
		return in, nil
	}
	in.StartedAt = time.Unix(0, r.StartedAt)
	if alive(r) {
		in.State = runtime.StateRunning
		return in, nil
	}
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

// freeUID returns the lowest user ID of the range no instance holds.
func (d *Driver) freeUID() (int, error) {
	used := map[int]bool{}
	ents, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		if r, err := d.load(e.Name()); err == nil {
			used[r.UID] = true
		}
	}
	for uid := d.cfg.FirstUID; uid < d.cfg.FirstUID+uidRange; uid++ {
		if !used[uid] {
			return uid, nil
		}
	}
	return 0, errdefs.Unavailable("all %d workload user IDs are taken", uidRange)
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
