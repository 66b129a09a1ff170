//go:build linux

package qemu_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/qemu"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/images/pull"
	"github.com/edgebox/edgebox/images/registry"
	"github.com/edgebox/edgebox/images/vm"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/vmtest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbredir"
)

// signedMessage is what the guest's apdu program
// (usbhub/usbredir/testdata/apdu) has the card sign.
const signedMessage = "statement 2026-11, signed in the guest"

// TestRedirIDs: AttachRedir and DetachRedir take only the ids usbID
// makes and socket paths a unix socket can have; a valid id on a VM not
// running cannot be attached, and detaching it is nothing.
func TestRedirIDs(t *testing.T) {
	t.Parallel()
	require.Tools(t, "QEMU (Debian: qemu-system-x86 qemu-utils)", "qemu-system-x86_64", "qemu-img")
	d := vmtest.Driver(t)
	long, err := qemu.New(qemu.Config{StateDir: filepath.Join(t.TempDir(), strings.Repeat("d", 60))})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		d         *qemu.Driver
		name, id  string
		attach    error // nil: no error
		detachErr error
	}{
		{"a key's id, no VM", d, "vm", "ukey-0a1b2c3d4e5f", errdefs.ErrConflict, nil},
		{"64 hex digits", d, "vm", "ukey-" + strings.Repeat("f", 64), errdefs.ErrConflict, nil},
		{"65 hex digits", d, "vm", "ukey-" + strings.Repeat("f", 65), errdefs.ErrInvalid, errdefs.ErrInvalid},
		{"no hex", d, "vm", "ukey-", errdefs.ErrInvalid, errdefs.ErrInvalid},
		{"upper case", d, "vm", "ukey-AB", errdefs.ErrInvalid, errdefs.ErrInvalid},
		{"not a key", d, "vm", "serial1", errdefs.ErrInvalid, errdefs.ErrInvalid},
		{"a path", d, "vm", "ukey-aa/../../qmp", errdefs.ErrInvalid, errdefs.ErrInvalid},
		{"QMP options", d, "vm", "ukey-aa,path=/x", errdefs.ErrInvalid, errdefs.ErrInvalid},
		{"no such VM name", d, "../vm", "ukey-aa", errdefs.ErrNotFound, nil},
		{"a socket path too long", long, "a-long-vm-name", "ukey-0a1b2c3d4e5f", errdefs.ErrInvalid, errdefs.ErrInvalid},
	} {
		t.Run(c.what, func(t *testing.T) {
			if _, err := c.d.AttachRedir(c.name, c.id); !errors.Is(err, c.attach) {
				t.Errorf("AttachRedir(%q, %q): %v, want %v", c.name, c.id, err, c.attach)
			}
			if err := c.d.DetachRedir(c.name, c.id); !errors.Is(err, c.detachErr) {
				t.Errorf("DetachRedir(%q, %q): %v, want %v", c.name, c.id, err, c.detachErr)
			}
		})
	}
}

// TestRedirHotplug: a key served over usbredir is plugged into a running
// VM workload (Debian's generic kernel under TCG) through QMP, and out,
// and in again: the guest sees it come with its vendor, product and
// serial, has its card sign through usbfs each time (the signature
// verifies with the key's public key), and sees it go. Attaching twice
// gives the same socket; detaching what is not there is no error. When
// the usbredir client goes without a detach, the guest sees the key go,
// and come back when a new client serves it on the same socket.
func TestRedirHotplug(t *testing.T) {
	vmtest.RequireUSB(t)
	d, ref := usbGuest(t)
	const vmName, id = "redir", "ukey-0a1b2c3d4e5f"
	boot(t, d, runtime.NewSpec(vmName, &edgeboxv1.Workload{Runtime: "qemu", Image: ref}))
	// The guest ignores the power button: quit QEMU at once at the end.
	t.Cleanup(func() { d.Stop(context.Background(), vmName, 0) })
	g := &guestLog{t: t, d: d, name: vmName}
	g.wait("the guest watching its bus", func(l []string) bool { return len(g.with(l, vmtest.USBWatching)) > 0 })

	socket, err := d.AttachRedir(vmName, id)
	if err != nil {
		t.Fatalf("AttachRedir: %v", err)
	}
	if fi, err := os.Stat(socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("AttachRedir's %s is no socket: %v", socket, err)
	}
	if again, err := d.AttachRedir(vmName, id); err != nil || again != socket {
		t.Fatalf("attaching again: %q, %v; want %q", again, err, socket)
	}

	s := serveKey(t, socket)
	g.plugged(1)
	if err := d.DetachRedir(vmName, id); err != nil {
		t.Fatalf("DetachRedir: %v", err)
	}
	g.gone(1)
	if ok, err := s.ended(10 * time.Second); !ok {
		t.Error("the usbredir host side still serves after the device is gone")
	} else {
		t.Logf("Serve after DetachRedir: %v", err)
	}
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is there after DetachRedir: %v", err)
	}
	if out, _ := d.QMP(vmName, []byte(`{"execute":"query-chardev"}`)); strings.Contains(string(out), id) {
		t.Errorf("the chardev is there after DetachRedir: %s", out)
	}
	for _, unknown := range []string{id, "ukey-00ff"} {
		if err := d.DetachRedir(vmName, unknown); err != nil {
			t.Errorf("detaching %s, not there: %v", unknown, err)
		}
	}

	// In again, on a new socket.
	if socket, err = d.AttachRedir(vmName, id); err != nil {
		t.Fatalf("AttachRedir again: %v", err)
	}
	s = serveKey(t, socket)
	g.plugged(2)

	// The client goes without a detach (a network blip, an agent
	// restarted): the guest sees the key go, and a new client on the
	// same socket brings it back.
	s.stop()
	g.gone(2)
	s = serveKey(t, socket)
	g.plugged(3)
	if err := d.DetachRedir(vmName, id); err != nil {
		t.Fatalf("DetachRedir: %v", err)
	}
	g.gone(3)
	s.stop()
}

// guestLog reads a VM's serial log.
type guestLog struct {
	t    *testing.T
	d    *qemu.Driver
	name string
}

func (g *guestLog) lines() []string {
	var b strings.Builder
	g.d.Logs(context.Background(), g.name, 0, &b)
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		out = append(out, strings.TrimSpace(l))
	}
	return out
}

// with returns what follows prefix on the lines that start with it.
func (g *guestLog) with(lines []string, prefix string) []string {
	var out []string
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			out = append(out, v)
		}
	}
	return out
}

// wait waits until done says the log holds what it waits for.
func (g *guestLog) wait(what string, done func([]string) bool) []string {
	g.t.Helper()
	t0 := time.Now()
	for deadline := t0.Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		l := g.lines()
		if done(l) {
			g.t.Logf("%s after %s", what, time.Since(t0).Round(time.Millisecond))
			return l
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("waiting for %s; the guest printed:\n%s", what, strings.Join(l, "\n"))
		}
	}
}

// plugged waits until the guest has seen the key come n times and had it
// sign n times, and checks what it saw and the last signature.
func (g *guestLog) plugged(n int) {
	g.t.Helper()
	l := g.wait("the key plugged", func(l []string) bool {
		return len(g.with(l, "APDU SIGNED "))+len(g.with(l, "APDU FAILED")) >= n
	})
	var plugs []string
	for _, v := range g.with(l, vmtest.USBLine) {
		if !strings.HasPrefix(vmtest.USBLine+v, vmtest.USBGoneLine) && vmtest.USBLine+v != vmtest.USBWatching {
			plugs = append(plugs, v)
		}
	}
	if len(plugs) != n {
		g.t.Fatalf("the guest saw %d plugs, want %d:\n%s", len(plugs), n, strings.Join(l, "\n"))
	}
	if !strings.HasPrefix(plugs[n-1], "1050:0407 UK-000123 /dev/bus/usb/") {
		g.t.Fatalf("the guest saw %q", plugs[n-1])
	}
	signed := g.with(l, "APDU SIGNED ")
	if len(signed) != n {
		g.t.Fatalf("the guest's program failed:\n%s", strings.Join(l, "\n"))
	}
	sig, err := hex.DecodeString(signed[n-1])
	digest := sha256.Sum256([]byte(signedMessage))
	if err != nil || !ecdsa.VerifyASN1(&ccid.TestKey().PublicKey, digest[:], sig) {
		g.t.Fatalf("the guest's signature %q does not verify: %v", signed[n-1], err)
	}
}

// gone waits until the guest has seen the key go n times.
func (g *guestLog) gone(n int) {
	g.t.Helper()
	l := g.wait("the key gone", func(l []string) bool { return len(g.with(l, vmtest.USBGoneLine)) >= n })
	if got := g.with(l, vmtest.USBGoneLine); len(got) != n || got[n-1] != "1050:0407 UK-000123" {
		g.t.Fatalf("the guest saw %q go, want the key %d times", got, n)
	}
}

// served is the usbredir host side serving the simulated key on a
// VM's socket.
type served struct {
	c      net.Conn
	cancel context.CancelFunc
	// done has Serve's error; once it came, err holds it.
	done chan error
	once sync.Once
	err  error
}

// serveKey dials socket and serves the simulated key on it until the test
// ends or stop.
func serveKey(t *testing.T, socket string) *served {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{c: c, cancel: cancel, done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	go func() { s.done <- usbredir.Serve(ctx, c, ccid.New(0x1050, 0x0407, "UK-000123"), log) }()
	t.Cleanup(s.stop)
	return s
}

// ended says whether Serve ended by itself within d, and its error.
func (s *served) ended(d time.Duration) (bool, error) {
	select {
	case err := <-s.done:
		s.once.Do(func() { s.err = err; s.cancel(); s.c.Close() })
		return true, err
	case <-time.After(d):
		return false, nil
	}
}

// stop ends Serve and closes the connection, and waits.
func (s *served) stop() {
	s.once.Do(func() {
		s.cancel()
		s.c.Close()
		s.err = <-s.done
	})
}

// usbGuest returns a driver holding the USB watching guest's image, with
// the apdu program of usbhub/usbredir as its /run-usb, and its
// reference.
func usbGuest(t *testing.T) (*qemu.Driver, string) {
	t.Helper()
	dir := t.TempDir()
	files := vmtest.USBWatchFiles(t, dir, vmtest.GuestProgram(t, "usbhub/usbredir/testdata/apdu"))
	reg, err := registry.Open(context.Background(), t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	tag, _ := name.ParseReference(host+"/vm/usb-guest:1", name.Insecure)
	// The generic kernel needs more memory than the cloud one.
	digest, err := vm.Push(tag, files, vm.Config{Cmdline: vmtest.Cmdline, MemoryBytes: 256 << 20})
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	ref := host + "/vm/usb-guest@" + digest.String()
	hc := pull.NewClient([]string{host}, func(ctx context.Context) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "tcp", host)
	}, nil)
	d := vmtest.Driver(t)
	if err := d.Pull(context.Background(), ref, hc, nil); err != nil {
		t.Fatalf("pull: %v", err)
	}
	return d, ref
}
