//go:build linux

package containerd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	"github.com/edgebox/edgebox/internal/ctrdtest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func TestConformance(t *testing.T) {
	sock := ctrdtest.Start(t)
	image := ctrdtest.BusyboxImage(t)
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Driver {
			d, err := New(Config{Address: sock, LogDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// Leave nothing running for the next subtest.
				ctx := context.Background()
				list, _ := d.List(ctx)
				for _, in := range list {
					d.Remove(ctx, in.Name)
				}
				d.Close()
			})
			names, err := d.Import(context.Background(), bytes.NewReader(image))
			if err != nil || len(names) != 1 || names[0] != ctrdtest.Image {
				t.Fatalf("import: %v %v", names, err)
			}
			return d
		},
		Workload: func(greeting string) *edgeboxv1.Workload {
			return &edgeboxv1.Workload{App: "robot", Release: "1", Runtime: "containerd", Image: ctrdtest.Image,
				Env: []string{"GREETING=" + greeting}, CpuMillis: 500, MemoryBytes: 64 << 20}
		},
		Output: func(greeting string) string { return "hello " + greeting },
		Exec:   func() ([]string, int) { return []string{"/bin/sh", "-c", `echo "hello $GREETING"; exit 3`}, 3 },
	})
}

func TestLimitsAndLogRotation(t *testing.T) {
	sock := ctrdtest.Start(t)
	image := ctrdtest.BusyboxImage(t)
	logDir := t.TempDir()
	d, err := New(Config{Address: sock, LogDir: logDir, MaxLogBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if _, err := d.Import(ctx, bytes.NewReader(image)); err != nil {
		t.Fatal(err)
	}
	w := &edgeboxv1.Workload{App: "robot", Runtime: "containerd", Image: ctrdtest.Image, CpuMillis: 250, MemoryBytes: 32 << 20,
		Env: []string{"GREETING=limited"}}
	if err := d.Create(ctx, runtime.NewSpec("limited", w)); err != nil {
		t.Fatal(err)
	}
	defer d.Remove(ctx, "limited")
	c, err := d.Client().LoadContainer(ns(ctx), "limited")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := c.Spec(ns(ctx))
	if err != nil {
		t.Fatal(err)
	}
	r := spec.Linux.Resources
	if r.Memory == nil || *r.Memory.Limit != 32<<20 || r.CPU == nil || *r.CPU.Quota != 25000 || *r.CPU.Period != 100000 {
		t.Fatalf("resources: %+v", r)
	}
	for range 2 {
		if err := d.Start(ctx, "limited"); err != nil {
			t.Fatal(err)
		}
		runtimeWait(t, func() bool {
			b, _ := os.ReadFile(filepath.Join(logDir, "limited.log"))
			return bytes.Contains(b, []byte("hello limited"))
		})
		if err := d.Stop(ctx, "limited", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// The log passed 16 bytes before the second start: the first run's
	// output was moved aside.
	old, err := os.ReadFile(filepath.Join(logDir, "limited.log.1"))
	if err != nil || !bytes.Contains(old, []byte("hello limited")) {
		t.Fatalf("rotated log: %q %v", old, err)
	}
}

func runtimeWait(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestImageCache: images are listed, complete, and removed.
func TestImageCache(t *testing.T) {
	sock := ctrdtest.Start(t)
	d, err := New(Config{Address: sock, LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if ok, err := d.HasImage(ctx, ctrdtest.Image); ok || err != nil {
		t.Fatalf("HasImage before import: %v %v", ok, err)
	}
	if _, err := d.Import(ctx, bytes.NewReader(ctrdtest.BusyboxImage(t))); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.HasImage(ctx, ctrdtest.Image); !ok || err != nil {
		t.Fatalf("HasImage after import: %v %v", ok, err)
	}
	if l, err := d.Images(ctx); err != nil || len(l) != 1 || l[0] != ctrdtest.Image {
		t.Fatalf("Images: %v %v", l, err)
	}
	if err := d.RemoveImage(ctx, ctrdtest.Image); err != nil {
		t.Fatal(err)
	}
	if err := d.RemoveImage(ctx, ctrdtest.Image); err != nil {
		t.Fatalf("removing a removed image: %v", err)
	}
	if l, err := d.Images(ctx); err != nil || len(l) != 0 {
		t.Fatalf("Images after remove: %v %v", l, err)
	}
}
