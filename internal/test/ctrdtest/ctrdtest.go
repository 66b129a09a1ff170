//go:build linux

// Package ctrdtest starts a containerd of a test's own and builds a small
// test image, for the containerd driver's tests and the integration tests
// that run real containers.
package ctrdtest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Start runs a containerd of the test's own, with its root,
// state and socket in a temporary directory, and returns its socket.
func Start(t testing.TB) string {
	t.Helper()
	require.Root(t, "running containerd")
	require.Tools(t, "containerd", "containerd", "containerd-shim-runc-v2")
	require.Tools(t, "runc", "runc")
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

// RuncRoot is the runc state directory for the containerd at sock: test
// daemons share the host, and runc's default directory would mix their
// containers up.
func RuncRoot(sock string) string { return filepath.Join(filepath.Dir(sock), "runc") }

// Image is the name of BusyboxImage's image.
const Image = "edgebox.test/busybox:1"

// BusyboxImage is BusyboxImg as a docker-save archive named Image.
func BusyboxImage(t testing.TB) []byte {
	t.Helper()
	img := BusyboxImg(t)
	ref, _ := name.ParseReference(Image)
	var out bytes.Buffer
	if err := tarball.Write(ref, img, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// BusyboxImg is an image built here from Debian's static busybox: a
// shell that says hello and waits to be stopped.
func BusyboxImg(t testing.TB) v1.Image {
	t.Helper()
	require.File(t, "/bin/busybox", "Debian's busybox-static; make test installs it")
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, l := range []string{"sh", "sleep", "echo", "cat", "ls"} {
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
		Cmd: []string{"/bin/sh", "-c", `trap 'echo bye; exit 0' TERM; echo "hello $GREETING"; while :; do sleep 1 & wait; done`}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
