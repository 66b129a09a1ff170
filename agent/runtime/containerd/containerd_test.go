//go:build linux

package containerd

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// startContainerd runs a containerd of the test's own, with its root,
// state and socket in a temporary directory, and returns its socket.
func startContainerd(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("containerd needs root (CI runs the tests as root)")
	}
	for _, tool := range []string{"containerd", "runc", "containerd-shim-runc-v2"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (Debian's containerd and runc; make test installs them)", tool)
		}
	}
	dir, err := os.MkdirTemp("", "ctrd") // short: the socket path must fit 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "c.sock")
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		exec.Command("umount", "-R", filepath.Join(dir, "state")).Run()
		os.RemoveAll(dir)
		if t.Failed() {
			t.Logf("containerd log:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not start:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const testImage = "edgebox.test/busybox:1"

// busyboxImage is an image built here from Debian's static busybox: a
// shell that says hello and waits to be stopped.
func busyboxImage(t *testing.T) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("busybox-static is not installed (make test installs it)")
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, l := range []string{"sh", "sleep", "echo", "cat"} {
		tw.WriteHeader(&tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	tw.Close()
	raw := layer.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	cf.Config = v1.Config{Env: []string{"PATH=/bin"},
		Cmd: []string{"/bin/sh", "-c", `trap 'echo bye; exit 0' TERM; echo "hello $GREETING"; while :; do sleep 1; done`}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(testImage)
	var out bytes.Buffer
	if err := tarball.Write(ref, img, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func TestConformance(t *testing.T) {
	sock := startContainerd(t)
	image := busyboxImage(t)
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
			if _, err := d.Client().Import(ns(context.Background()), bytes.NewReader(image)); err != nil {
				t.Fatal(err)
			}
			return d
		},
		Workload: func(greeting string) *edgeboxv1.Workload {
			return &edgeboxv1.Workload{App: "robot", Release: "1", Runtime: "containerd", Image: testImage,
				Env: []string{"GREETING=" + greeting}, CpuMillis: 500, MemoryBytes: 64 << 20}
		},
		Output: func(greeting string) string { return "hello " + greeting },
	})
}

func TestLimitsAndLogRotation(t *testing.T) {
	sock := startContainerd(t)
	image := busyboxImage(t)
	logDir := t.TempDir()
	d, err := New(Config{Address: sock, LogDir: logDir, MaxLogBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if _, err := d.Client().Import(ns(ctx), bytes.NewReader(image)); err != nil {
		t.Fatal(err)
	}
	w := &edgeboxv1.Workload{App: "robot", Runtime: "containerd", Image: testImage, CpuMillis: 250, MemoryBytes: 32 << 20,
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
