// Package fake is an in-memory runtime.Driver for tests and demos. It
// counts what it was asked to do, can be told to fail, and lets a test
// "crash" an instance.
package fake

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
)

// Driver is a fake runtime. The zero value is not usable; use New.
type Driver struct {
	*state
	// crash is the crash hook of this opening of the state.
	crash runtime.CrashHook
}

// state is what a fake runtime holds: it outlives a Driver, as a real
// runtime's state outlives the agent (Reopen).
type state struct {
	runtime string

	mu        sync.Mutex // guards everything below
	instances map[string]*runtime.Instance
	calls     map[string]int // "create", "start", … -> count
	creates   map[string]int // name+"@"+hash -> count
	fail      map[string]error
	failRel   map[string]error // release -> the error its starts fail with
	logs      map[string][]string
	what      map[string]string // name -> "app release", for the logs
	images    map[string]bool   // pulled; nil: every image is present
}

// New returns an empty fake driver serving runtime rt.
func New(rt string) *Driver {
	return &Driver{state: &state{runtime: rt, instances: map[string]*runtime.Instance{}, calls: map[string]int{},
		creates: map[string]int{}, fail: map[string]error{}, failRel: map[string]error{}, logs: map[string][]string{}, what: map[string]string{}}}
}

// Reopen returns a driver on d's instances, as a restarted agent opens a
// runtime's state, with crash as its crash hook.
func (d *Driver) Reopen(crash runtime.CrashHook) *Driver {
	return &Driver{state: d.state, crash: crash}
}

// crashPoints: each operation of the fake changes its state at once; the
// agent may be killed after the change and before it hears of it.
var crashPoints = []string{"create/recorded", "start/running", "stop/stopped", "remove/removed"}

// CrashPoints lists where the crash hook is called.
func (d *Driver) CrashPoints() []string { return crashPoints }

var _ runtime.CrashPointer = (*Driver)(nil)

// Copies counts the running instances of workloads of release rel.
func (d *Driver) Copies(rel string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for name, in := range d.instances {
		if in.State == runtime.StateRunning && strings.HasSuffix(d.what[name], " "+rel) {
			n++
		}
	}
	return n
}

func (d *Driver) Runtime() string { return d.runtime }

func (d *Driver) call(op, name string) error {
	d.calls[op]++
	if err := d.fail[op+" "+name]; err != nil {
		return err
	}
	return d.fail[op+" *"]
}

func (d *Driver) Create(_ context.Context, s runtime.Spec) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("create", s.Name); err != nil {
		return err
	}
	if _, ok := d.instances[s.Name]; ok {
		return errdefs.Conflict("instance %s exists", s.Name)
	}
	d.instances[s.Name] = &runtime.Instance{Name: s.Name, Hash: s.Hash, State: runtime.StateCreated}
	d.creates[s.Name+"@"+s.Hash]++
	d.what[s.Name] = s.Workload.GetApp() + " " + s.Workload.GetRelease()
	d.logs[s.Name] = []string{"created " + d.what[s.Name]}
	return d.crash.At(crashPoints, "create/recorded")
}

func (d *Driver) Start(_ context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("start", name); err != nil {
		return err
	}
	if _, rel, _ := strings.Cut(d.what[name], " "); d.failRel[rel] != nil {
		return d.failRel[rel]
	}
	in, ok := d.instances[name]
	if !ok {
		return errdefs.NotFound("no instance %s", name)
	}
	if in.State != runtime.StateRunning {
		in.State, in.StartedAt, in.ExitCode = runtime.StateRunning, time.Now(), 0
		d.logs[name] = append(d.logs[name], "started "+d.what[name])
	}
	return d.crash.At(crashPoints, "start/running")
}

func (d *Driver) Stop(_ context.Context, name string, _ time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("stop", name); err != nil {
		return err
	}
	if in, ok := d.instances[name]; ok && in.State == runtime.StateRunning {
		in.State = runtime.StateExited
		d.logs[name] = append(d.logs[name], "stopped")
	}
	return d.crash.At(crashPoints, "stop/stopped")
}

func (d *Driver) Remove(_ context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("remove", name); err != nil {
		return err
	}
	delete(d.instances, name)
	delete(d.logs, name)
	return d.crash.At(crashPoints, "remove/removed")
}

func (d *Driver) List(context.Context) ([]runtime.Instance, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("list", "*"); err != nil {
		return nil, err
	}
	out := make([]runtime.Instance, 0, len(d.instances))
	for _, in := range d.instances {
		out = append(out, *in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (d *Driver) Inspect(_ context.Context, name string) (runtime.Instance, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	in, ok := d.instances[name]
	if !ok {
		return runtime.Instance{}, errdefs.NotFound("no instance %s", name)
	}
	return *in, nil
}

func (d *Driver) Logs(_ context.Context, name string, tail int, w io.Writer) error {
	d.mu.Lock()
	lines, ok := d.logs[name]
	lines = append([]string(nil), lines...)
	d.mu.Unlock()
	if !ok {
		return errdefs.NotFound("no instance %s", name)
	}
	if tail > 0 && len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	for _, l := range lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	return nil
}

// Crash makes a running instance exit with code, as if it died.
func (d *Driver) Crash(name string, code int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in, ok := d.instances[name]; ok {
		in.State, in.ExitCode = runtime.StateExited, code
	}
}

// FailOn makes op ("create", "start", "stop", "remove", "list") fail for
// name ("*" for every name) until called again with a nil error.
func (d *Driver) FailOn(op, name string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(d.fail, op+" "+name)
		return
	}
	d.fail[op+" "+name] = err
}

// FailRelease makes every start of an instance of release rel fail with
// err, until called again with a nil error: a release that does not run
// on this box.
func (d *Driver) FailRelease(rel string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(d.failRel, rel)
		return
	}
	d.failRel[rel] = err
}

// Calls returns how often op was called.
func (d *Driver) Calls(op string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[op]
}

// Creates returns how often an instance of name with spec hash was created.
func (d *Driver) Creates(name, hash string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.creates[name+"@"+hash]
}

// Running returns the names of running instances, sorted.
func (d *Driver) Running() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for n, in := range d.instances {
		if in.State == runtime.StateRunning {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// String describes the driver's instances, for test failures.
func (d *Driver) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fmt.Sprintf("fake %s: %d instances, calls %v", d.runtime, len(d.instances), d.calls)
}

// TrackImages makes the driver hold images: a workload's image must be
// pulled before it runs, and pulled images can be listed and removed.
// Without it every image counts as present.
func (d *Driver) TrackImages() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.images = map[string]bool{}
}

// HasImage says whether ref was pulled (always true without TrackImages).
func (d *Driver) HasImage(_ context.Context, ref string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.images == nil || d.images[ref], nil
}

// Pull takes ref as pulled.
func (d *Driver) Pull(_ context.Context, ref string, _ *http.Client, progress func(runtime.Progress)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("pull", ref); err != nil {
		return err
	}
	if d.images != nil {
		d.images[ref] = true
	}
	if progress != nil {
		progress(runtime.Progress{Done: 1, Total: 1})
	}
	return nil
}

// Images lists the pulled images.
func (d *Driver) Images(context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for ref := range d.images {
		out = append(out, ref)
	}
	sort.Strings(out)
	return out, nil
}

// RemoveImage forgets a pulled image.
func (d *Driver) RemoveImage(_ context.Context, ref string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("rmi", ref); err != nil {
		return err
	}
	delete(d.images, ref)
	return nil
}
