package runtimetest

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
)

// errCrashed is what the crash hook returns at the point it kills the
// agent.
var errCrashed = errors.New("runtimetest: the agent was killed here")

// operations are what a crash point may interrupt, in the order the test
// runs them: a crash in stop comes after create and start.
var operations = []string{"create", "start", "stop", "remove"}

// greetings makes every crash run's workload unique on the box, so its
// copies can be counted apart from other tests' (other packages' tests
// run at the same time).
var greetings atomic.Int64

// crashes kills the agent (through the driver's crash hook) at each crash
// point the driver declares, then opens a new driver on the same state as
// a restarted agent would, and checks that it finds exactly what exists
// and converges: to the workload running, or to it removed and then made
// again. Nothing may run twice, nothing may be left running after a
// remove, and no operation may fail for good.
func crashes(t *testing.T, h Harness) {
	if h.Restart == nil || h.Copies == nil {
		t.Fatal("the harness gives no Restart or Copies: every driver passes the crash-point test")
	}
	cp, ok := h.Restart(t)(nil).(runtime.CrashPointer)
	if !ok {
		t.Fatal("the driver declares no crash points (runtime.CrashPointer)")
	}
	points := cp.CrashPoints()
	seen := map[string]bool{}
	for _, p := range points {
		op, step, _ := strings.Cut(p, "/")
		if !isOperation(op) || step == "" {
			t.Fatalf("crash point %q is not <operation>/<step> with operation one of %v", p, operations)
		}
		seen[op] = true
	}
	for _, op := range []string{"create", "start", "remove"} {
		if !seen[op] {
			t.Fatalf("the driver declares no crash point in %s: %v", op, points)
		}
	}
	for _, p := range points {
		for _, then := range []string{"desired", "removed"} {
			t.Run(strings.ReplaceAll(p, "/", ":")+"/then-"+then, func(t *testing.T) { crashAt(t, h, p, then) })
		}
	}
}

func isOperation(op string) bool {
	for _, o := range operations {
		if o == op {
			return true
		}
	}
	return false
}

// crashAt kills the agent at point, then has a new one converge on then:
// "desired" (the workload runs) or "removed" (it is gone, and a new one
// of the same name can be made).
func crashAt(t *testing.T, h Harness, point, then string) {
	open := h.Restart(t)
	greeting := fmt.Sprintf("crash%d-%d", os.Getpid(), greetings.Add(1))
	name := "crashed"
	spec := runtime.NewSpec(name, h.Workload(greeting))
	fired := false
	d := open(func(at string) error {
		if at == point && !fired {
			fired = true
			return errCrashed
		}
		return nil
	})
	op, _, _ := strings.Cut(point, "/")
	steps := []struct {
		op  string
		run func() error
	}{
		{"create", func() error { return d.Create(ctx(t), spec) }},
		{"start", func() error { return d.Start(ctx(t), name) }},
		{"stop", func() error { return d.Stop(ctx(t), name, 10*time.Second) }},
		{"remove", func() error { return d.Remove(ctx(t), name) }},
	}
	for _, s := range steps {
		if s.op == "stop" && op == "remove" {
			continue // remove stops what runs itself
		}
		err := s.run()
		if errors.Is(err, errCrashed) {
			break
		}
		must(t, s.op+" before the crash", err)
		if s.op == op {
			break
		}
	}
	if !fired {
		t.Fatalf("%s never reached its crash point %s", op, point)
	}
	t.Logf("killed at %s", point)

	// The agent starts again on the same state, and sweeps first.
	d = open(nil)
	if sw, ok := d.(runtime.Sweeper); ok {
		orphans, err := sw.Sweep(ctx(t))
		must(t, "sweep", err)
		for _, o := range orphans {
			t.Logf("swept: %+v", o)
		}
	}
	// What it lists is what exists: the instance is listed running if
	// and only if one copy of it runs.
	var listed runtime.Instance
	var found bool
	eventually(t, "the list to agree with what runs", func() bool {
		list, err := d.List(ctx(t))
		must(t, "list after the crash", err)
		listed, found = runtime.Instance{}, false
		for _, in := range list {
			if in.Name != name {
				t.Fatalf("after the crash the driver lists %+v, which was never made", in)
			}
			listed, found = in, true
		}
		n := h.Copies(t, greeting)
		if n > 1 {
			t.Fatalf("after a crash at %s, %d copies run", point, n)
		}
		return (found && listed.State == runtime.StateRunning) == (n == 1)
	})
	if found && listed.Hash != spec.Hash {
		t.Fatalf("after the crash the instance has hash %q, want %q", listed.Hash, spec.Hash)
	}

	switch then {
	case "desired":
		// As the reconciler converges: create what is not listed, start
		// what does not run.
		if !found {
			must(t, "create after the crash", d.Create(ctx(t), spec))
		}
		if !found || listed.State != runtime.StateRunning {
			must(t, "start after the crash", d.Start(ctx(t), name))
		}
		running(t, h, d, name, greeting)
	case "removed":
		if found {
			must(t, "stop after the crash", d.Stop(ctx(t), name, 10*time.Second))
			must(t, "remove after the crash", d.Remove(ctx(t), name))
		}
		gone(t, h, d, name, greeting)
		// The same name is free for a new workload.
		must(t, "create again", d.Create(ctx(t), spec))
		must(t, "start again", d.Start(ctx(t), name))
		running(t, h, d, name, greeting)
	}
	must(t, "remove", d.Remove(ctx(t), name))
	gone(t, h, d, name, greeting)
}

// running checks that the instance runs, once.
func running(t *testing.T, h Harness, d runtime.Driver, name, greeting string) {
	t.Helper()
	in := state(t, d, name)
	if in.State != runtime.StateRunning || in.StartedAt.IsZero() {
		t.Fatalf("after converging: %+v, want running with a start time", in)
	}
	eventually(t, "one copy to run", func() bool { return h.Copies(t, greeting) == 1 })
	// A second copy starting late would show now.
	time.Sleep(300 * time.Millisecond)
	if n := h.Copies(t, greeting); n != 1 {
		t.Fatalf("%d copies run", n)
	}
	must(t, "start what runs", d.Start(ctx(t), name))
	if n := h.Copies(t, greeting); n != 1 {
		t.Fatalf("after starting a running instance, %d copies run", n)
	}
}

// gone checks that nothing of the instance is left.
func gone(t *testing.T, h Harness, d runtime.Driver, name, greeting string) {
	t.Helper()
	eventually(t, "no copy to run", func() bool { return h.Copies(t, greeting) == 0 })
	if _, err := d.Inspect(ctx(t), name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("inspect after remove: %v", err)
	}
	list, err := d.List(ctx(t))
	must(t, "list", err)
	if len(list) != 0 {
		t.Fatalf("list after remove: %+v", list)
	}
}
