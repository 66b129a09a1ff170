// Package runtimetest is the conformance suite every runtime.Driver
// passes: the fake, containerd, QEMU and process drivers. Besides the
// lifecycle, it kills the agent (through the driver's crash hook) at every
// crash point the driver declares and checks that the next agent finds
// exactly what exists and converges, with nothing running twice and
// nothing left running after a remove.
package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Harness is what a driver's test gives the suite.
type Harness struct {
	// New returns a driver with no instances.
	New func(t *testing.T) runtime.Driver
	// Workload returns a workload the driver can run that keeps running
	// and writes greeting (from its GREETING environment variable) to its
	// output once started.
	Workload func(greeting string) *edgeboxv1.Workload
	// Output is what a running instance of Workload(greeting) shows in its
	// logs.
	Output func(greeting string) string
	// Exec, for drivers that are runtime.Execers, is a command that
	// prints greeting (from the instance's environment) and exits with
	// code.
	Exec func() (argv []string, code int)
	// Restart starts a state of the driver's own, fresh at each call, and
	// returns how to open a driver on it as a starting agent does, with
	// crash as its crash hook (nil: none). Drivers opened by one returned
	// function share that state, as an agent and the agent that comes
	// after it do.
	Restart func(t *testing.T) func(crash runtime.CrashHook) runtime.Driver
	// Copies counts the copies of Workload(greeting) that run, as the box
	// sees them (its processes), not as a driver says.
	Copies func(t *testing.T, greeting string) int
}

// Run runs the suite against h.
func Run(t *testing.T, h Harness) {
	t.Run("Lifecycle", func(t *testing.T) { lifecycle(t, h) })
	t.Run("Idempotent", func(t *testing.T) { idempotent(t, h) })
	t.Run("Independent", func(t *testing.T) { independent(t, h) })
	t.Run("Unknown", func(t *testing.T) { unknown(t, h) })
	t.Run("Crash", func(t *testing.T) { crashes(t, h) })
	if h.Exec != nil {
		t.Run("Exec", func(t *testing.T) { execIn(t, h) })
	}
}

func execIn(t *testing.T, h Harness) {
	d := h.New(t)
	x, ok := d.(runtime.Execer)
	if !ok {
		t.Fatal("the harness gives an Exec command for a driver that cannot exec")
	}
	spec := runtime.NewSpec("shell", h.Workload("from-exec"))
	must(t, "create", d.Create(ctx(t), spec))
	argv, want := h.Exec()
	var out, errOut bytes.Buffer
	if _, err := x.Exec(ctx(t), "shell", argv, &out, &errOut); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("exec in an instance that is not running: %v", err)
	}
	must(t, "start", d.Start(ctx(t), "shell"))
	code, err := x.Exec(ctx(t), "shell", argv, &out, &errOut)
	must(t, "exec", err)
	if code != want || !strings.Contains(out.String(), h.Output("from-exec")) {
		t.Fatalf("exec: code %d (want %d), stdout %q, stderr %q", code, want, out.String(), errOut.String())
	}
	must(t, "remove", d.Remove(ctx(t), "shell"))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func state(t *testing.T, d runtime.Driver, name string) runtime.Instance {
	t.Helper()
	in, err := d.Inspect(ctx(t), name)
	must(t, "inspect "+name, err)
	return in
}

// eventually waits for cond, for drivers whose instances settle
// asynchronously.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func logs(t *testing.T, d runtime.Driver, name string) string {
	t.Helper()
	var b bytes.Buffer
	must(t, "logs", d.Logs(ctx(t), name, 0, &b))
	return b.String()
}

func lifecycle(t *testing.T, h Harness) {
	d := h.New(t)
	spec := runtime.NewSpec("robot", h.Workload("hello-1"))
	must(t, "create", d.Create(ctx(t), spec))
	if in := state(t, d, "robot"); in.State != runtime.StateCreated || in.Hash != spec.Hash {
		t.Fatalf("after create: %+v, want created with hash %s", in, spec.Hash)
	}
	must(t, "start", d.Start(ctx(t), "robot"))
	in := state(t, d, "robot")
	if in.State != runtime.StateRunning || in.StartedAt.IsZero() {
		t.Fatalf("after start: %+v", in)
	}
	eventually(t, "its output", func() bool { return strings.Contains(logs(t, d, "robot"), h.Output("hello-1")) })

	list, err := d.List(ctx(t))
	must(t, "list", err)
	if len(list) != 1 || list[0].Name != "robot" || list[0].Hash != spec.Hash || list[0].State != runtime.StateRunning {
		t.Fatalf("list: %+v", list)
	}

	must(t, "stop", d.Stop(ctx(t), "robot", 10*time.Second))
	if in := state(t, d, "robot"); in.State != runtime.StateExited {
		t.Fatalf("after stop: %+v", in)
	}
	// A stopped instance starts again: the restart policy relies on it.
	must(t, "start again", d.Start(ctx(t), "robot"))
	if in := state(t, d, "robot"); in.State != runtime.StateRunning {
		t.Fatalf("after a second start: %+v", in)
	}
	must(t, "remove", d.Remove(ctx(t), "robot"))
	if _, err := d.Inspect(ctx(t), "robot"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("inspect after remove: %v", err)
	}
	list, err = d.List(ctx(t))
	must(t, "list", err)
	if len(list) != 0 {
		t.Fatalf("list after remove: %+v", list)
	}
}

func idempotent(t *testing.T, h Harness) {
	d := h.New(t)
	spec := runtime.NewSpec("again", h.Workload("hello-2"))
	must(t, "create", d.Create(ctx(t), spec))
	if err := d.Create(ctx(t), spec); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("creating an existing instance: %v, want a conflict", err)
	}
	must(t, "start", d.Start(ctx(t), "again"))
	must(t, "start a running instance", d.Start(ctx(t), "again"))
	must(t, "stop", d.Stop(ctx(t), "again", 10*time.Second))
	must(t, "stop a stopped instance", d.Stop(ctx(t), "again", 10*time.Second))
	must(t, "remove a stopped instance", d.Remove(ctx(t), "again"))
	must(t, "remove a removed instance", d.Remove(ctx(t), "again"))
	must(t, "stop a removed instance", d.Stop(ctx(t), "again", time.Second))

	// Removing a running instance stops it first.
	must(t, "create", d.Create(ctx(t), spec))
	must(t, "start", d.Start(ctx(t), "again"))
	must(t, "remove a running instance", d.Remove(ctx(t), "again"))
	if _, err := d.Inspect(ctx(t), "again"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("inspect after removing a running instance: %v", err)
	}
}

func independent(t *testing.T, h Harness) {
	d := h.New(t)
	a, b := runtime.NewSpec("a", h.Workload("from-a")), runtime.NewSpec("b", h.Workload("from-b"))
	if a.Hash == b.Hash {
		t.Fatal("different workloads have one hash")
	}
	for _, s := range []runtime.Spec{a, b} {
		must(t, "create "+s.Name, d.Create(ctx(t), s))
		must(t, "start "+s.Name, d.Start(ctx(t), s.Name))
	}
	eventually(t, "b's output", func() bool { return strings.Contains(logs(t, d, "b"), h.Output("from-b")) })
	must(t, "stop a", d.Stop(ctx(t), "a", 10*time.Second))
	if in := state(t, d, "b"); in.State != runtime.StateRunning {
		t.Fatalf("stopping a stopped b: %+v", in)
	}
	if strings.Contains(logs(t, d, "a"), h.Output("from-b")) {
		t.Fatal("a's logs hold b's output")
	}
	for _, n := range []string{"a", "b"} {
		must(t, "remove "+n, d.Remove(ctx(t), n))
	}
}

func unknown(t *testing.T, h Harness) {
	d := h.New(t)
	if _, err := d.Inspect(ctx(t), "nobody"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("inspect of an unknown instance: %v", err)
	}
	if err := d.Logs(ctx(t), "nobody", 10, &bytes.Buffer{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("logs of an unknown instance: %v", err)
	}
	if err := d.Start(ctx(t), "nobody"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("start of an unknown instance: %v", err)
	}
}
