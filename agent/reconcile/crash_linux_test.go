//go:build linux

package reconcile

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/process"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	"github.com/edgebox/edgebox/internal/test/require"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// crashUIDs are the workload user IDs of these tests, apart from other
// packages' tests that run at the same time (agent/runtime/process takes
// 900000 to 939999, internal/test/integration 650000 to 820000): a sweep ends
// every process in its range that its own state does not hold.
const crashUIDs = 950000

// agentOn is an agent's reconciler with a real process driver on state:
// what a (re)started agent runs. It sweeps, as Run does first.
func agentOn(t *testing.T, state string, src *source) (*Reconciler, *book) {
	t.Helper()
	d, err := process.New(process.Config{StateDir: state, CgroupRoot: t.TempDir(), FirstUID: crashUIDs, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	b := &book{status: map[string]*edgeboxv1.ObjectStatus{}}
	r, err := New(Config{Source: src, Drivers: []runtime.Driver{d}, Reporter: b, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	r.sweep(context.Background())
	t.Cleanup(func() {
		list, _ := d.List(context.Background())
		for _, in := range list {
			d.Remove(context.Background(), in.Name)
		}
		d.Sweep(context.Background())
	})
	return r, b
}

func putProcess(src *source, name, greeting string) {
	src.put(name, "process", "1")
	w := src.objs[name].GetWorkload()
	w.Image, w.Args = "/bin/sh", []string{"-c", `echo "hello $GREETING"; while :; do sleep 1; done`}
	w.Env = []string{"GREETING=" + greeting}
}

// TestAKilledAgentComesBack puts a native workload through what a
// kill -9 of the agent leaves, with real processes under their own users:
// every time, the next agent converges — the workload runs, once — and
// after its removal nothing of it runs.
func TestAKilledAgentComesBack(t *testing.T) {
	require.Root(t, "running programs as workload users")
	for _, c := range []struct {
		name string
		// before the first agent; after it converged and was killed
		before, after func(t *testing.T, state string)
		sweeps        int // OrphanStopped events at the second start
	}{
		{name: "half-made instance directory", before: func(t *testing.T, state string) {
			os.MkdirAll(filepath.Join(state, "w-x", "home"), 0o700)
		}},
		{name: "start not recorded", after: func(t *testing.T, state string) {
			os.Remove(filepath.Join(state, "w-x", "run.json"))
		}},
		{name: "instance gone, program still running", after: func(t *testing.T, state string) {
			os.RemoveAll(filepath.Join(state, "w-x"))
		}, sweeps: 1},
		{name: "instance being removed", after: func(t *testing.T, state string) {
			os.Rename(filepath.Join(state, "w-x"), filepath.Join(state, ".rm-w-x-1"))
		}, sweeps: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			state, err := os.MkdirTemp("", "rc")
			if err != nil {
				t.Fatal(err)
			}
			os.Chmod(state, 0o711)
			t.Cleanup(func() { os.RemoveAll(state) })
			greeting := fmt.Sprintf("reconcile%d-%d", os.Getpid(), time.Now().UnixNano())
			src := &source{objs: map[string]*edgeboxv1.DesiredObject{}}
			putProcess(src, "w-x", greeting)
			if c.before != nil {
				c.before(t, state)
			}
			r, b := agentOn(t, state, src)
			pass(t, r)
			if s := b.status["w-x"]; s.GetPhase() != "Running" {
				t.Fatalf("first agent: status %v", s)
			}
			if c.after != nil {
				// kill -9: the agent is gone, its programs run on.
				c.after(t, state)
				r, b = agentOn(t, state, src)
				if n := b.reasons()["OrphanStopped"]; n != c.sweeps {
					t.Errorf("%d OrphanStopped events at start, want %d: %v", n, c.sweeps, b.events)
				}
				pass(t, r)
			}
			if s := b.status["w-x"]; s.GetPhase() != "Running" {
				t.Fatalf("status %v, want Running", s)
			}
			if n := runtimetest.Processes(t, greeting); n != 1 {
				t.Fatalf("%d copies run", n)
			}
			pass(t, r) // the next pass changes nothing
			if n := runtimetest.Processes(t, greeting); n != 1 {
				t.Fatalf("after another pass, %d copies run", n)
			}
			src.del("w-x")
			pass(t, r)
			if n := runtimetest.Processes(t, greeting); n != 0 {
				t.Fatalf("after the workload was removed, %d copies run", n)
			}
			putProcess(src, "w-x", greeting) // and put again
			pass(t, r)
			if s := b.status["w-x"]; s.GetPhase() != "Running" || runtimetest.Processes(t, greeting) != 1 {
				t.Fatalf("put again: status %v, %d copies", s, runtimetest.Processes(t, greeting))
			}
		})
	}
}

// TestOrphanSweep: processes running as a workload user no instance
// holds (left by an older agent) are stopped when the agent starts, and
// reported.
func TestOrphanSweep(t *testing.T) {
	require.Root(t, "running programs as workload users")
	cmd := exec.Command("/bin/sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: crashUIDs + 7, Gid: crashUIDs + 7}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	state, _ := os.MkdirTemp("", "rc")
	os.Chmod(state, 0o711)
	t.Cleanup(func() { os.RemoveAll(state) })
	d, err := process.New(process.Config{StateDir: state, CgroupRoot: t.TempDir(), FirstUID: crashUIDs, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	b := &book{status: map[string]*edgeboxv1.ObjectStatus{}}
	r, err := New(Config{Source: &source{objs: map[string]*edgeboxv1.DesiredObject{}}, Drivers: []runtime.Driver{d}, Reporter: b, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The agent starts its reconciler, which sweeps first.
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); r.Run(ctx) }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Error("the orphan still runs after the sweep")
	}
	cancel()
	<-ran
	if len(b.events) != 1 || b.events[0].GetReason() != "OrphanStopped" || !b.events[0].GetWarning() {
		t.Fatalf("events %v, want one OrphanStopped warning", b.events)
	}
}
