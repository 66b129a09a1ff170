//go:build linux

package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	"github.com/edgebox/edgebox/internal/test/require"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func workload(greeting string) *edgeboxv1.Workload {
	return &edgeboxv1.Workload{App: "robot", Release: "1", Runtime: "process", Image: "/bin/sh",
		Args: []string{"-c", `trap 'echo bye; exit 0' TERM; echo "hello $GREETING"; while :; do sleep 1; done`},
		Env:  []string{"GREETING=" + greeting}}
}

func TestConformance(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Driver {
			d, err := New(Config{StateDir: stateDir(t), CgroupRoot: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				list, _ := d.List(t.Context())
				for _, in := range list {
					d.Remove(t.Context(), in.Name)
				}
			})
			return d
		},
		Workload: workload,
		Output:   func(greeting string) string { return "hello " + greeting },
		Restart: func(t *testing.T) func(runtime.CrashHook) runtime.Driver {
			require.Root(t, "running programs as workload users")
			state, cgroups := stateDir(t), t.TempDir()
			var opened []*Driver
			t.Cleanup(func() {
				// What the last agent finds is removed; the sweep ends
				// the rest.
				if len(opened) > 0 {
					d := opened[len(opened)-1]
					list, _ := d.List(context.Background())
					for _, in := range list {
						d.Remove(context.Background(), in.Name)
					}
					d.Sweep(context.Background())
				}
			})
			return func(crash runtime.CrashHook) runtime.Driver {
				d, err := New(Config{StateDir: state, CgroupRoot: cgroups, FirstUID: crashUIDs, Crash: crash,
					Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
				if err != nil {
					t.Fatal(err)
				}
				opened = append(opened, d)
				return d
			}
		},
		Copies: runtimetest.Processes,
	})
}

// crashUIDs is the first user ID of the crash-point tests' drivers, apart
// from the other tests' (here, and in other packages that run at the same
// time: internal/test/integration's boxes take 650000 to 820000), whose
// workloads their sweeps must not touch. Tests here that need ranges of
// their own take the next ones, 10,000 apart.
const crashUIDs = 900000

func TestLimitsAndARestartedAgent(t *testing.T) {
	require.Root(t, "setting cgroup limits")
	for _, ctrl := range []string{"memory", "cpu"} {
		require.File(t, filepath.Join("/sys/fs/cgroup", ctrl, "cgroup.procs"), "the cgroup v1 "+ctrl+" controller")
	}
	state := stateDir(t)
	d, _ := New(Config{StateDir: state}) // the real /sys/fs/cgroup
	name := fmt.Sprintf("limited-%d", os.Getpid())
	w := workload("limits")
	w.CpuMillis, w.MemoryBytes = 250, 32<<20
	if err := d.Create(t.Context(), runtime.NewSpec(name, w)); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.Remove(context.Background(), name)
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory/edgebox", name)); err == nil {
			t.Error("the workload's cgroup stayed after Remove")
		}
	}()
	for f, want := range map[string]string{
		"memory/edgebox/" + name + "/memory.limit_in_bytes": "33554432",
		"cpu/edgebox/" + name + "/cpu.cfs_quota_us":         "25000",
	} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", f))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q (%v), want %s", f, b, err, want)
		}
	}
	var r run
	if err := readJSON(filepath.Join(state, name, "run.json"), &r); err != nil {
		t.Fatal(err)
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", r.PID))
	if !strings.Contains(string(cg), "memory:/edgebox/"+name) || !strings.Contains(string(cg), "/edgebox/"+name) {
		t.Fatalf("the program is not in its cgroups:\n%s", cg)
	}
	// A new driver on the same state, as after an agent restart, finds
	// the program running.
	d2, _ := New(Config{StateDir: state})
	in, err := d2.Inspect(t.Context(), name)
	if err != nil || in.State != runtime.StateRunning {
		t.Fatalf("after an agent restart: %+v %v", in, err)
	}
	if err := d2.Create(t.Context(), runtime.NewSpec("nothing", &edgeboxv1.Workload{Image: "/no/such/program"})); err == nil ||
		!strings.Contains(err.Error(), "not an executable") {
		t.Fatalf("a missing program: %v", err)
	}
}

// stateDir is a state directory workloads' users can pass through.
func stateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "proc")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestRunsUnderItsOwnUser: each workload has a user ID of its own, not
// root, a home it owns, and cannot read the agent's files.
func TestRunsUnderItsOwnUser(t *testing.T) {
	require.Root(t, "running programs as other users")
	state := stateDir(t)
	d, err := New(Config{StateDir: state, CgroupRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(state, "agent-secret")
	os.WriteFile(secret, []byte("key"), 0o600)
	script := `echo "uid=$(id -u) home=$HOME"; touch "$HOME/mine" && echo wrote-home; cat ` + secret + ` || echo cannot-read; sleep 60`
	ctx := t.Context()
	for _, name := range []string{"one", "two"} {
		w := &edgeboxv1.Workload{Runtime: "process", Image: "/bin/sh", Args: []string{"-c", script}}
		if err := d.Create(ctx, runtime.NewSpec(name, w)); err != nil {
			t.Fatal(err)
		}
		if err := d.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Remove(context.Background(), name) })
	}
	uids := map[string]bool{}
	for _, name := range []string{"one", "two"} {
		var out string
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out, "cannot-read") && !strings.Contains(out, "key") {
			if time.Now().After(deadline) {
				t.Fatalf("%s said %q", name, out)
			}
			time.Sleep(20 * time.Millisecond)
			var b strings.Builder
			d.Logs(ctx, name, 0, &b)
			out = b.String()
		}
		if !strings.Contains(out, "wrote-home") || !strings.Contains(out, "cannot-read") || strings.Contains(out, "uid=0 ") {
			t.Fatalf("%s: %q", name, out)
		}
		uid := strings.Fields(strings.TrimPrefix(out[strings.Index(out, "uid="):], "uid="))[0]
		uids[uid] = true
	}
	if len(uids) != 2 {
		t.Fatalf("the two workloads share a user: %v", uids)
	}
}

// TestKeyDeviceForItsUser: the device node of a key leased to a native
// workload belongs to the workload's user while it runs, and to root
// again once it is removed.
func TestKeyDeviceForItsUser(t *testing.T) {
	require.Root(t, "device nodes and other users")
	d, err := New(Config{StateDir: stateDir(t), CgroupRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(t.TempDir(), "005")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(189, 4))); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	w := &edgeboxv1.Workload{Runtime: "process", Image: "/bin/sh", Args: []string{"-c", "sleep 60"}}
	spec := runtime.NewSpecWith("keyed", w, []runtime.Device{{KeyID: "k-1", HostPath: node}})
	if err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "keyed"); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Stat(node, &st)
	if st.Uid < 690000 {
		t.Fatalf("the key's node belongs to uid %d, not the workload's user", st.Uid)
	}
	if err := d.Remove(ctx, "keyed"); err != nil {
		t.Fatal(err)
	}
	unix.Stat(node, &st)
	if st.Uid != 0 {
		t.Fatalf("after removal the node still belongs to uid %d", st.Uid)
	}
}

// TestHalfMadeInstance: a directory of an instance's name without its
// spec (what an older agent killed while making it left) is not an
// instance: List does not show it, and Create makes the instance in its
// place instead of answering a conflict.
func TestHalfMadeInstance(t *testing.T) {
	require.Root(t, "running programs as workload users")
	state := stateDir(t)
	d, err := New(Config{StateDir: state, CgroupRoot: t.TempDir(), FirstUID: crashUIDs + 10000})
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(state, "w-x", "home"), 0o700)
	if list, _ := d.List(t.Context()); len(list) != 0 {
		t.Fatalf("list shows a half-made instance: %+v", list)
	}
	spec := runtime.NewSpec("w-x", workload("half"))
	if err := d.Create(t.Context(), spec); err != nil {
		t.Fatalf("create over a half-made instance: %v", err)
	}
	t.Cleanup(func() { d.Remove(context.Background(), "w-x") })
	if err := d.Start(t.Context(), "w-x"); err != nil {
		t.Fatal(err)
	}
	if in, err := d.Inspect(t.Context(), "w-x"); err != nil || in.State != runtime.StateRunning || in.Hash != spec.Hash {
		t.Fatalf("inspect: %+v %v", in, err)
	}
}

// TestUserIDNotReused: a user ID is not handed to a new instance while a
// process runs as it, though no instance holds it; the sweep stops that
// process, and only then is the user ID free again.
func TestUserIDNotReused(t *testing.T) {
	require.Root(t, "running programs as workload users")
	first := crashUIDs + 20000
	cmd := exec.Command("/bin/sh", "-c", "sleep 600 & sleep 600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: uint32(first), Gid: uint32(first)}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	d, err := New(Config{StateDir: stateDir(t), CgroupRoot: t.TempDir(), FirstUID: first})
	if err != nil {
		t.Fatal(err)
	}
	uidOf := func(name string) int {
		t.Helper()
		if err := d.Create(t.Context(), runtime.NewSpec(name, workload(name))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Remove(context.Background(), name) })
		rec, err := d.load(name)
		if err != nil {
			t.Fatal(err)
		}
		return rec.UID
	}
	if uid := uidOf("second"); uid == first {
		t.Fatalf("user %d was handed out while an orphan runs as it", uid)
	}
	orphans, err := d.Sweep(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 1 || len(orphans[0].PIDs) < 2 {
		t.Fatalf("sweep: %+v, want the orphan and its child", orphans)
	}
	<-exited
	if uid := uidOf("third"); uid != first {
		t.Fatalf("after the sweep the new instance has user %d, want the freed %d", uid, first)
	}
}

// TestRemoveEndsEverything: what a program started in a session of its
// own (a daemon leaving the program's process group) ends with the
// instance, whether the program is stopped, removed, or started again.
func TestRemoveEndsEverything(t *testing.T) {
	require.Root(t, "running programs as workload users")
	d, err := New(Config{StateDir: stateDir(t), CgroupRoot: t.TempDir(), FirstUID: crashUIDs + 30000})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, op := range []string{"stop", "remove", "restart"} {
		t.Run(op, func(t *testing.T) {
			greeting := fmt.Sprintf("daemon%d-%s", os.Getpid(), op)
			w := &edgeboxv1.Workload{Runtime: "process", Image: "/bin/sh", Env: []string{"GREETING=" + greeting},
				Args: []string{"-c", `setsid sleep 600 & echo started; exit 3`}}
			if err := d.Create(ctx, runtime.NewSpec("daemon", w)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Remove(context.Background(), "daemon") })
			if err := d.Start(ctx, "daemon"); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				in, _ := d.Inspect(ctx, "daemon")
				if in.State == runtime.StateExited && runtimetest.Processes(t, greeting) == 1 {
					break // the program ended; its daemon runs
				}
				if time.Now().After(deadline) {
					t.Fatalf("the program did not leave its daemon running: %+v, %d", in, runtimetest.Processes(t, greeting))
				}
				time.Sleep(20 * time.Millisecond)
			}
			want := 0
			switch op {
			case "stop":
				err = d.Stop(ctx, "daemon", time.Second)
			case "remove":
				err = d.Remove(ctx, "daemon")
			case "restart":
				err, want = d.Start(ctx, "daemon"), 1 // the new run's program, or its daemon
			}
			if err != nil {
				t.Fatal(err)
			}
			// A restart: the old daemon is gone before the new program
			// starts, so at most the new run's copy is there.
			if n := runtimetest.Processes(t, greeting); n > want {
				t.Fatalf("after %s, %d copies run, want at most %d", op, n, want)
			}
			if err := d.Remove(ctx, "daemon"); err != nil {
				t.Fatal(err)
			}
			if n := runtimetest.Processes(t, greeting); n != 0 {
				t.Fatalf("after remove, %d copies run", n)
			}
		})
	}
}

// TestCgroupsAfterAKilledStart: a program whose agent was killed before
// it set its limits gets them when the next agent adopts it, in the real
// cgroups; and once nothing of the instance is left on disk, the sweep
// ends its program and removes its cgroups.
func TestCgroupsAfterAKilledStart(t *testing.T) {
	require.Root(t, "setting cgroup limits")
	for _, ctrl := range []string{"memory", "cpu"} {
		require.File(t, filepath.Join("/sys/fs/cgroup", ctrl, "cgroup.procs"), "the cgroup v1 "+ctrl+" controller")
	}
	state := stateDir(t)
	name := fmt.Sprintf("adopted-%d", os.Getpid())
	greeting := "adopted-" + name
	w := workload(greeting)
	w.CpuMillis, w.MemoryBytes = 250, 32<<20
	crashed := errors.New("killed")
	cfg := Config{StateDir: state, FirstUID: crashUIDs + 40000, Crash: func(p string) error {
		if p == "start/started" {
			return crashed
		}
		return nil
	}}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Create(t.Context(), runtime.NewSpec(name, w)); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(t.Context(), name); !errors.Is(err, crashed) {
		t.Fatalf("start: %v, want the crash", err)
	}
	cfg.Crash = nil
	d, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Remove(context.Background(), name); d.Sweep(context.Background()) })
	if err := d.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if n := runtimetest.Processes(t, greeting); n != 1 {
		t.Fatalf("%d copies run", n)
	}
	var r run
	if err := readJSON(filepath.Join(state, name, "run.json"), &r); err != nil || r.Starting {
		t.Fatalf("run record %+v: %v", r, err)
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", r.PID))
	if !strings.Contains(string(cg), "memory:/edgebox/"+name+"\n") {
		t.Fatalf("the adopted program is not in its memory cgroup:\n%s", cg)
	}
	if b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/edgebox", name, "memory.limit_in_bytes")); strings.TrimSpace(string(b)) != "33554432" {
		t.Fatalf("memory limit %q", b)
	}

	os.RemoveAll(filepath.Join(state, name)) // its state is lost; its program runs on
	orphans, err := d.Sweep(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) == 0 {
		t.Fatal("the sweep found no orphan")
	}
	if n := runtimetest.Processes(t, greeting); n != 0 {
		t.Fatalf("after the sweep %d copies run", n)
	}
	for _, ctrl := range []string{"memory", "cpu"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl, "edgebox", name)); err == nil {
			t.Errorf("the %s cgroup of the gone instance stayed", ctrl)
		}
	}
}

// TestSweepLeavesOtherRuntimes: containerd's containers have cgroups
// under edgebox/ too; the sweep leaves them and what runs in them alone.
func TestSweepLeavesOtherRuntimes(t *testing.T) {
	require.Root(t, "cgroups")
	require.File(t, "/sys/fs/cgroup/memory/cgroup.procs", "the cgroup v1 memory controller")
	dir := filepath.Join("/sys/fs/cgroup/memory/edgebox", fmt.Sprintf("container-%d", os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sleep", "600") // a container's process, as root
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited; os.Remove(dir) })
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{StateDir: stateDir(t), FirstUID: crashUIDs + 50000})
	if err != nil {
		t.Fatal(err)
	}
	orphans, err := d.Sweep(t.Context())
	if err != nil || len(orphans) != 0 {
		t.Fatalf("sweep: %+v %v", orphans, err)
	}
	select {
	case <-exited:
		t.Fatal("the sweep killed another runtime's process")
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the sweep removed another runtime's cgroup: %v", err)
	}
}
