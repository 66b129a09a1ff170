//go:build linux

package usbip

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/vmtest"
	"github.com/edgebox/edgebox/usbhub/ccid"
)

// TestTheKernelsVHCIAttachesTheKey: a real guest (Debian's generic
// kernel under TCG, its vhci-hcd) runs AttachVHCI itself against this
// package's server on the host's loopback, over QEMU's user network. The
// key appears on the guest's vhci bus with its vendor, product and
// serial; its card signs through usbfs, and the signature verifies
// against the key here. DetachVHCI unplugs it, which ends the kernel's
// connection: the server offers the key again. The kernel refuses what the package
// says it does: a device not offered takes no port, a second detach is
// invalid.
func TestTheKernelsVHCIAttachesTheKey(t *testing.T) {
	vmtest.RequireUSBIP(t)
	require.Tools(t, "Go (the guest's program is built by the test)", "go")
	_, addr := serveDevice(t, ccid.New(0x1050, 0x0407, "UK-000123"), 0)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := vmtest.USBIPFiles(t, dir, vmtest.GuestProgram(t, "usbhub/usbip/testdata/vhci"))
	serial := filepath.Join(dir, "serial.log")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", "-nodefaults", "-display", "none", "-machine", "pc", "-accel", "tcg", "-m", "256",
		"-no-reboot", "-kernel", files.Kernel, "-initrd", files.Initrd,
		"-append", "console=ttyS0 panic=-1 quiet USBIP_SERVER="+net.JoinHostPort(vmtest.HostFromGuest, port)+" USBIP_BUSID=1-1",
		"-serial", "file:"+serial,
		"-netdev", "user,id=n", "-device", "e1000,netdev=n,romfile=")
	var stderr bytes.Buffer
	qemu.Stderr = &stderr
	err = qemu.Run() // the guest powers off when done
	out, _ := os.ReadFile(serial)
	if err != nil {
		t.Fatalf("QEMU: %v; %s\nguest:\n%s", err, stderr.String(), out)
	}
	t.Logf("the guest, in %v:\n%s", time.Since(start).Round(time.Millisecond), out)
	var sigHex, device string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "VHCI DEVICE "); ok {
			device = v
		}
		if v, ok := strings.CutPrefix(line, "APDU SIGNED "); ok {
			sigHex = v
		}
	}
	if !strings.Contains(string(out), vmtest.USBIPDone+"0") {
		t.Fatalf("the guest's program failed")
	}
	if !strings.HasPrefix(device, "1050:0407 UK-000123 /dev/bus/usb/") {
		t.Fatalf("the guest saw the device as %q", device)
	}
	for _, want := range []string{"VHCI REFUSED 9-9:", "VHCI DETACHED port", "VHCI OFFERED AGAIN 1-1", "VHCI REFUSED a second detach:"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the guest did not print %q", want)
		}
	}
	sig, err := hex.DecodeString(sigHex)
	digest := sha256.Sum256([]byte("statement 2026-11, signed in the guest over vhci-hcd"))
	if err != nil || !ecdsa.VerifyASN1(&ccid.TestKey().PublicKey, digest[:], sig) {
		t.Fatalf("the guest's signature %q does not verify: %v", sigHex, err)
	}
}
