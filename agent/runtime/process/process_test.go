//go:build linux

package process

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
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
			d, err := New(Config{StateDir: t.TempDir(), CgroupRoot: t.TempDir()})
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
	})
}

func TestLimitsAndARestartedAgent(t *testing.T) {
	state, cg := t.TempDir(), t.TempDir()
	for _, ctrl := range []string{"memory", "cpu"} {
		os.MkdirAll(filepath.Join(cg, ctrl), 0o755)
	}
	d, _ := New(Config{StateDir: state, CgroupRoot: cg})
	w := workload("limits")
	w.CpuMillis, w.MemoryBytes = 250, 32<<20
	if err := d.Create(t.Context(), runtime.NewSpec("limited", w)); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(t.Context(), "limited"); err != nil {
		t.Fatal(err)
	}
	defer d.Remove(t.Context(), "limited")
	for f, want := range map[string]string{
		"memory/edgebox/limited/memory.limit_in_bytes": "33554432",
		"cpu/edgebox/limited/cpu.cfs_quota_us":         "25000",
	} {
		b, err := os.ReadFile(filepath.Join(cg, f))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %s", f, b, err, want)
		}
	}
	// A new driver on the same state, as after an agent restart, finds
	// the program running.
	d2, _ := New(Config{StateDir: state, CgroupRoot: cg})
	in, err := d2.Inspect(t.Context(), "limited")
	if err != nil || in.State != runtime.StateRunning {
		t.Fatalf("after an agent restart: %+v %v", in, err)
	}
	if err := d2.Create(t.Context(), runtime.NewSpec("nothing", &edgeboxv1.Workload{Image: "/no/such/program"})); err == nil ||
		!strings.Contains(err.Error(), "not an executable") {
		t.Fatalf("a missing program: %v", err)
	}
}
