//go:build linux

package containerd

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
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
		Restart: func(t *testing.T) func(runtime.CrashHook) runtime.Driver {
			logDir := t.TempDir()
			imported := false
			return func(crash runtime.CrashHook) runtime.Driver {
				d, err := New(Config{Address: sock, LogDir: logDir, Crash: crash})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					ctx := context.Background()
					list, _ := d.List(ctx)
					for _, in := range list {
						d.Remove(ctx, in.Name)
					}
					d.Close()
				})
				if !imported {
					if _, err := d.Import(context.Background(), bytes.NewReader(image)); err != nil {
						t.Fatal(err)
					}
					imported = true
				}
				return d
			}
		},
		Copies: runtimetest.Processes,
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

// TestKeyDeviceInContainer: a container gets the device node of the key
// leased to it, at /dev/bus/usb/BBB/DDD, with a cgroup rule for it alone;
// the box's other USB devices are not there.
func TestKeyDeviceInContainer(t *testing.T) {
	sock := ctrdtest.Start(t)
	d, err := New(Config{Address: sock, LogDir: t.TempDir(), RuncRoot: ctrdtest.RuncRoot(sock)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if _, err := d.Import(ctx, bytes.NewReader(ctrdtest.BusyboxImage(t))); err != nil {
		t.Fatal(err)
	}
	devRoot := t.TempDir()
	os.MkdirAll(filepath.Join(devRoot, "001"), 0o755)
	for i, n := range []string{"005", "006"} {
		// 189 is the USB device major.
		if err := unix.Mknod(filepath.Join(devRoot, "001", n), unix.S_IFCHR|0o660, int(unix.Mkdev(189, uint32(4+i)))); err != nil {
			t.Fatal(err)
		}
	}
	w := &edgeboxv1.Workload{App: "robot", Runtime: "containerd", Image: ctrdtest.Image,
		Args: []string{"/bin/sh", "-c", "echo keys: $(ls /dev/bus/usb/001); sleep 60"}}
	key := runtime.Device{KeyID: "k-1", HostPath: filepath.Join(devRoot, "001", "005"), Path: "/dev/bus/usb/001/005"}
	spec := runtime.NewSpecWith("robot", w, []runtime.Device{key})
	if spec.Hash == runtime.NewSpec("robot", w).Hash {
		t.Fatal("a leased key does not change the spec's hash")
	}
	if err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	defer d.Remove(ctx, "robot")
	if err := d.Start(ctx, "robot"); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "keys:") {
		if time.Now().After(deadline) {
			t.Fatalf("no output: %q", out.String())
		}
		time.Sleep(50 * time.Millisecond)
		out.Reset()
		d.Logs(ctx, "robot", 0, &out)
	}
	if got := strings.TrimSpace(out.String()); got != "keys: 005" {
		t.Fatalf("the container sees %q, want only its key 005", got)
	}
	c, _ := d.Client().LoadContainer(ns(ctx), "robot")
	s, err := c.Spec(ns(ctx))
	if err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for _, r := range s.Linux.Resources.Devices {
		if r.Allow && r.Major != nil && *r.Major == 189 {
			allowed++
			if *r.Minor != 4 {
				t.Errorf("cgroup rule for 189:%d", *r.Minor)
			}
		}
	}
	if allowed != 1 {
		t.Errorf("%d cgroup rules for USB devices, want 1", allowed)
	}
}

// TestVolumesSurviveReleases: what a release writes to its volume, the
// next release of the app finds.
func TestVolumesSurviveReleases(t *testing.T) {
	sock := ctrdtest.Start(t)
	vols := t.TempDir()
	d, err := New(Config{Address: sock, LogDir: t.TempDir(), VolumeDir: vols, RuncRoot: ctrdtest.RuncRoot(sock)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if _, err := d.Import(ctx, bytes.NewReader(ctrdtest.BusyboxImage(t))); err != nil {
		t.Fatal(err)
	}
	run := func(release, script string) string {
		t.Helper()
		w := &edgeboxv1.Workload{App: "bank", Release: release, Runtime: "containerd", Image: ctrdtest.Image,
			Args:    []string{"/bin/sh", "-c", script + "; echo done"},
			Volumes: []*edgeboxv1.Volume{{Name: "statements", Path: "/data"}}}
		if err := d.Create(ctx, runtime.NewSpec("bank", w)); err != nil {
			t.Fatal(err)
		}
		defer d.Remove(ctx, "bank")
		if err := d.Start(ctx, "bank"); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(out.String(), "done") {
			if time.Now().After(deadline) {
				t.Fatalf("release %s: %q", release, out.String())
			}
			time.Sleep(50 * time.Millisecond)
			out.Reset()
			d.Logs(ctx, "bank", 0, &out)
		}
		return out.String()
	}
	run("1", "echo statement-2026-11 > /data/latest")
	if out := run("2", "cat /data/latest"); !strings.Contains(out, "statement-2026-11") {
		t.Fatalf("release 2 does not find release 1's data: %q", out)
	}
	if _, err := os.Stat(filepath.Join(vols, "bank", "statements", "latest")); err != nil {
		t.Fatalf("the volume is not on the box: %v", err)
	}
	bad := &edgeboxv1.Workload{App: "bank", Runtime: "containerd", Image: ctrdtest.Image,
		Volumes: []*edgeboxv1.Volume{{Name: "../etc", Path: "/data"}}}
	if err := d.Create(ctx, runtime.NewSpec("bad", bad)); err == nil {
		d.Remove(ctx, "bad")
		t.Fatal("a volume named ../etc was accepted")
	}
}

// TestCreateAfterAKilledCreate: an agent killed between making a
// container's root filesystem and the container leaves the snapshot under
// its lease; the next Create (of the next release, say) makes the container all the same, without a
// sweep first, instead of answering a conflict for as long as the lease
// lives.
func TestCreateAfterAKilledCreate(t *testing.T) {
	sock := ctrdtest.Start(t)
	image := ctrdtest.BusyboxImage(t)
	logDir := t.TempDir()
	ctx := context.Background()
	crashed := errors.New("killed")
	d, err := New(Config{Address: sock, LogDir: logDir, Crash: func(p string) error {
		if p == "create/snapshot" {
			return crashed
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Import(ctx, bytes.NewReader(image)); err != nil {
		t.Fatal(err)
	}
	// The next release's image, on another root filesystem chain: the
	// snapshot left is not one its Create can take as it is.
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "release", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("2"))
	tw.Close()
	l, err := tarball.LayerFromReader(&layer)
	if err != nil {
		t.Fatal(err)
	}
	next, err := mutate.AppendLayers(ctrdtest.BusyboxImg(t), l)
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	ref, _ := name.ParseReference("edgebox.test/busybox:2")
	if err := tarball.Write(ref, next, &archive); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Import(ctx, &archive); err != nil {
		t.Fatal(err)
	}
	if err := d.Create(ctx, runtime.NewSpec("again", &edgeboxv1.Workload{Runtime: "containerd", Image: ctrdtest.Image})); !errors.Is(err, crashed) {
		t.Fatalf("create: %v, want the crash", err)
	}
	if _, err := d.Client().SnapshotService("overlayfs").Stat(ns(ctx), "again-rootfs"); err != nil {
		t.Fatalf("the killed create left no snapshot, so this test tests nothing: %v", err)
	}
	d2, err := New(Config{Address: sock, LogDir: logDir})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	spec := runtime.NewSpec("again", &edgeboxv1.Workload{Runtime: "containerd", Image: "edgebox.test/busybox:2"})
	if err := d2.Create(ctx, spec); err != nil {
		t.Fatalf("create after a killed create: %v", err)
	}
	defer d2.Remove(ctx, "again")
	if in, err := d2.Inspect(ctx, "again"); err != nil || in.Hash != spec.Hash {
		t.Fatalf("inspect: %+v %v", in, err)
	}
}
