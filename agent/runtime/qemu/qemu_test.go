//go:build linux

package qemu_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/qemu"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	"github.com/edgebox/edgebox/images/pull"
	"github.com/edgebox/edgebox/images/registry"
	"github.com/edgebox/edgebox/images/vm"
	"github.com/edgebox/edgebox/internal/test/vmtest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// guestRegistry serves a registry holding the test guest, pushed the way
// 'edgebox image push-disk' does, and returns the image's reference and a
// client that reaches it the way a box does.
func guestRegistry(t testing.TB) (ref string, fetch func(d *qemu.Driver)) {
	t.Helper()
	files := vmtest.Files(t, t.TempDir(), 16)
	reg, err := registry.Open(context.Background(), t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	tag, _ := name.ParseReference(host+"/vm/guest:1", name.Insecure)
	d, err := vm.Push(tag, files, vm.Config{Cmdline: vmtest.Cmdline, MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	ref = host + "/vm/guest@" + d.String()
	hc := pull.NewClient([]string{host}, func(ctx context.Context) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "tcp", host)
	}, nil)
	return ref, func(drv *qemu.Driver) {
		t.Helper()
		if err := drv.Pull(context.Background(), ref, hc, nil); err != nil {
			t.Fatalf("pull: %v", err)
		}
	}
}

func newDriver(t *testing.T) *qemu.Driver { return vmtest.Driver(t) }

// guest returns a driver holding the test guest's image, and its
// reference.
func guest(t *testing.T) (*qemu.Driver, string) {
	t.Helper()
	ref, fetch := guestRegistry(t)
	d := newDriver(t)
	fetch(d)
	return d, ref
}

// boot creates and starts VM name from s.
func boot(t *testing.T, d *qemu.Driver, s runtime.Spec) {
	t.Helper()
	if err := d.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background(), s.Name); err != nil {
		t.Fatal(err)
	}
}

// TestConformance: the driver passes the suite every driver passes, with
// a real Linux guest booting under QEMU (TCG here).
func TestConformance(t *testing.T) {
	vmtest.Require(t)
	ref, fetch := guestRegistry(t)
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Driver {
			d := newDriver(t)
			fetch(d)
			return d
		},
		Workload: func(greeting string) *edgeboxv1.Workload {
			return &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Env: []string{"GREETING=" + greeting}}
		},
		Output: func(greeting string) string { return "hello " + greeting },
		// The crash-point test's VMs are held before their guest runs
		// (-S): QEMU and its sockets are all there is to crash around.
		Restart: func(t *testing.T) func(runtime.CrashHook) runtime.Driver {
			dir, err := os.MkdirTemp("", "q") // short: socket paths must fit 108 bytes
			if err != nil {
				t.Fatal(err)
			}
			var last *qemu.Driver
			t.Cleanup(func() {
				if last != nil {
					list, _ := last.List(context.Background())
					for _, in := range list {
						last.Remove(context.Background(), in.Name)
					}
					last.Sweep(context.Background())
				}
				os.RemoveAll(dir)
			})
			return func(crash runtime.CrashHook) runtime.Driver {
				d, err := qemu.New(qemu.Config{StateDir: dir, ExtraArgs: []string{"-S"}, Crash: crash})
				if err != nil {
					t.Fatal(err)
				}
				if last == nil {
					fetch(d)
				}
				last = d
				return d
			}
		},
		Copies: runtimetest.Processes,
	})
}

// marker writes or checks a pattern at the start of a qcow2 file.
func marker(t *testing.T, path string, write bool) bool {
	t.Helper()
	cmd := "read -P 0x42 0 512"
	if write {
		cmd = "write -P 0x42 0 512"
	}
	out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", cmd, path).CombinedOutput()
	if write && err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	return err == nil && !strings.Contains(string(out), "Pattern verification failed")
}

// TestEveryStartIsClean: what a VM wrote to its disk is gone at its next
// start, unless it keeps its state.
func TestEveryStartIsClean(t *testing.T) {
	vmtest.Require(t)
	d, ref := guest(t)
	ctx := context.Background()
	for _, keep := range []bool{false, true} {
		name := "clean"
		if keep {
			name = "kept"
		}
		w := &edgeboxv1.Workload{Runtime: "qemu", Image: ref, KeepState: keep}
		boot(t, d, runtime.NewSpec(name, w))
		if err := d.Stop(ctx, name, time.Second); err != nil {
			t.Fatal(err)
		}
		overlay := d.OverlayPath(name)
		marker(t, overlay, true) // what the robot left behind
		if err := d.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := d.Stop(ctx, name, time.Second); err != nil {
			t.Fatal(err)
		}
		if got := marker(t, overlay, false); got != keep {
			t.Errorf("keep_state=%v: the last run's write is there: %v", keep, got)
		}
		if in, err := d.Inspect(ctx, name); err != nil || in.State != runtime.StateExited || in.ExitCode != 0 {
			t.Errorf("after stop: %+v %v", in, err)
		}
	}
}

// TestGracefulStop: Stop presses the ACPI power button and the guest
// powers itself off, well before the timeout.
func TestGracefulStop(t *testing.T) {
	vmtest.Require(t)
	d, ref := guest(t)
	ctx := context.Background()
	boot(t, d, runtime.NewSpec("polite", &edgeboxv1.Workload{Runtime: "qemu", Image: ref}))
	logs := waitUp(t, d, "polite")
	t0 := time.Now()
	if err := d.Stop(ctx, "polite", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 20*time.Second || !strings.Contains(logs(), "powering off") {
		t.Fatalf("stop took %s; the guest did not power itself off:\n%s", took, logs())
	}
}

// TestUSBHotplug: QEMU takes a key on its command line and by QMP
// hot-plug, matched on host bus and port, and lets it go again.
func TestUSBHotplug(t *testing.T) {
	vmtest.Require(t)
	d, ref := guest(t)
	first := runtime.Device{KeyID: "k-aa", Bus: 1, Port: "1-1.3"}
	w := &edgeboxv1.Workload{Runtime: "qemu", Image: ref}
	boot(t, d, runtime.NewSpecWith("keyed", w, []runtime.Device{first}))
	list := func() string {
		out, err := d.QMP("keyed", []byte(`{"execute":"qom-list","arguments":{"path":"/machine/peripheral"}}`))
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	if !strings.Contains(list(), "ukey-aa") {
		t.Fatalf("the key from the command line is not in the VM: %s", list())
	}
	second := runtime.Device{KeyID: "k-bb", Bus: 2, Port: "2-4"}
	if err := d.AttachUSB("keyed", second); err != nil {
		t.Fatalf("device_add: %v", err)
	}
	if !strings.Contains(list(), "ukey-bb") {
		t.Fatalf("the hot-plugged key is not in the VM: %s", list())
	}
	if err := d.DetachUSB("keyed", second); err != nil {
		t.Fatalf("device_del: %v", err)
	}
	if err := d.AttachUSB("keyed", first); err == nil {
		t.Error("the same key attached twice")
	}
}

// TestPausedVM: a VM someone paused (QMP stop) still counts as running,
// ignores the power button, and is stopped by quitting QEMU after the
// timeout; its screen and serial sockets are there while it runs.
func TestPausedVM(t *testing.T) {
	vmtest.Require(t)
	d, ref := guest(t)
	ctx := context.Background()
	boot(t, d, runtime.NewSpec("paused", &edgeboxv1.Workload{Runtime: "qemu", Image: ref}))
	vnc, serial, err := d.Consoles("paused")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{vnc, serial} {
		if fi, err := os.Stat(s); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Fatalf("%s is no socket: %v", s, err)
		}
	}
	if _, err := d.QMP("paused", []byte(`{"execute":"stop"}`)); err != nil {
		t.Fatal(err)
	}
	out, _ := d.QMP("paused", []byte(`{"execute":"query-status"}`))
	if !strings.Contains(string(out), `"paused"`) {
		t.Fatalf("query-status: %s", out)
	}
	if in, _ := d.Inspect(ctx, "paused"); in.State != runtime.StateRunning {
		t.Fatalf("a paused VM is %s", in.State)
	}
	t0 := time.Now()
	if err := d.Stop(ctx, "paused", time.Second); err != nil {
		t.Fatal(err)
	}
	if in, _ := d.Inspect(ctx, "paused"); in.State != runtime.StateExited || time.Since(t0) > 15*time.Second {
		t.Fatalf("after stop: %s, took %s", in.State, time.Since(t0))
	}
	if _, _, err := d.Consoles("paused"); err == nil {
		t.Error("consoles of a stopped VM")
	}
	if err := d.Start(ctx, "paused"); err != nil {
		t.Fatalf("start again: %v", err)
	}
}

// TestSerialSession: a session reaches the guest's shell on its second
// serial port and runs a command there; a second session at once is
// refused, and one after it is not.
func TestSerialSession(t *testing.T) {
	vmtest.Require(t)
	d, ref := guest(t)
	ctx := context.Background()
	boot(t, d, runtime.NewSpec("serial", &edgeboxv1.Workload{Runtime: "qemu", Image: ref}))
	waitUp(t, d, "serial")
	if _, err := d.Session(ctx, "serial", runtime.SessionSpec{Command: []string{"ls"}}); err == nil {
		t.Fatal("a command on a serial console was taken")
	}
	open := func() (runtime.SessionProcess, *io.PipeWriter, *lockedBuf) {
		in, inW := io.Pipe()
		out := &lockedBuf{}
		p, err := d.Session(ctx, "serial", runtime.SessionSpec{TTY: true, Stdin: in, Stdout: out, Stderr: out})
		if err != nil {
			t.Fatal(err)
		}
		return p, inW, out
	}
	p, in, out := open()
	// Type once the guest's shell shows its prompt: what comes before it
	// may be lost while the shell starts.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "# ") {
		if time.Now().After(deadline) {
			t.Fatalf("no prompt on the serial console: %q", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	in.Write([]byte("echo serial-$((40+2))\n"))
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "serial-42") {
		if time.Now().After(deadline) {
			t.Fatalf("the guest's serial shell did not answer: %q", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := d.Session(ctx, "serial", runtime.SessionSpec{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard}); err == nil {
		t.Fatal("a second session on the serial console at once was taken")
	}
	p.Close()
	in.Close()
	p2, in2, out2 := open()
	defer in2.Close()
	defer p2.Close()
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(out2.String(), "# ") {
		if time.Now().After(deadline) {
			t.Fatalf("no prompt on the second session: %q", out2.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	in2.Write([]byte("echo again-$((1+1))\n"))
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(out2.String(), "again-2") {
		if time.Now().After(deadline) {
			t.Fatalf("the second session got no answer: %q", out2.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitUp waits until VM name's guest says it is up, and returns a reader
// of its serial log.
func waitUp(t *testing.T, d *qemu.Driver, name string) (logs func() string) {
	t.Helper()
	logs = func() string {
		var b strings.Builder
		d.Logs(context.Background(), name, 0, &b)
		return b.String()
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(logs(), vmtest.Up) {
		if time.Now().After(deadline) {
			t.Fatalf("guest not up:\n%s", logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return logs
}
