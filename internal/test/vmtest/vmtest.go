//go:build linux

// Package vmtest builds a tiny guest for the QEMU tests: Debian's kernel
// (unpacked by scripts/test-deps.sh) and an initramfs of Debian's static
// busybox whose init says hello with the GREETING it finds in fw_cfg, then
// idles until the ACPI power button powers it off. Under TCG it is up in a few seconds.
package vmtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/cavaliergopher/cpio"

	"github.com/edgebox/edgebox/agent/runtime/qemu"
	"github.com/edgebox/edgebox/images/vm"
	"github.com/edgebox/edgebox/internal/test/require"
)

// Cmdline is the guest's kernel command line.
const Cmdline = "console=ttyS0 quiet panic=-1"

// Up is what the guest prints once its init runs.
const Up = "edgebox-guest up"

func kernelDir() string {
	if d := os.Getenv("EDGEBOX_TEST_KERNEL_DIR"); d != "" {
		return d
	}
	return "/var/cache/edgebox-test/kernel"
}

// Require fails or skips (per require's rules) a test without QEMU or the
// test kernel.
func Require(t testing.TB) {
	t.Helper()
	require.Tools(t, "QEMU (Debian: qemu-system-x86)", "qemu-system-x86_64")
	require.Tools(t, "qemu-img (Debian: qemu-utils)", "qemu-img", "qemu-io")
	require.File(t, filepath.Join(kernelDir(), "vmlinuz"), "a Debian kernel; scripts/test-deps.sh unpacks it")
	for _, m := range []string{"qemu_fw_cfg.ko", "button.ko", "evdev.ko"} {
		require.File(t, filepath.Join(kernelDir(), m), "the kernel's modules; scripts/test-deps.sh unpacks them")
	}
	require.File(t, "/bin/busybox", "Debian's busybox-static")
}

const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs none /dev
mount -t proc none /proc
mount -t sysfs none /sys
exec >/dev/ttyS0 2>&1 </dev/ttyS0
insmod /qemu_fw_cfg.ko
insmod /button.ko
insmod /evdev.ko
# The ACPI power button (the only input device) powers the guest off;
# its device node appears shortly after the module loads.
i=0
while [ ! -e /dev/input/event0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
for e in /dev/input/event*; do
	(head -c 1 $e >/dev/null && echo "powering off" && poweroff -f) &
done
env=/sys/firmware/qemu_fw_cfg/by_name/opt/edgebox/env/raw
if [ -f $env ]; then
	while IFS= read -r line || [ -n "$line" ]; do export "$line"; done < $env
fi
echo "` + Up + `"
echo "hello $GREETING"
while :; do sleep 1; done
`

// Files writes the guest into dir: kernel, initramfs and, with diskMB > 0,
// an empty qcow2 disk of that size.
func Files(t testing.TB, dir string, diskMB int) vm.Files {
	t.Helper()
	Require(t)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	mods := map[string][]byte{}
	for _, m := range []string{"qemu_fw_cfg.ko", "button.ko", "evdev.ko"} {
		if mods[m], err = os.ReadFile(filepath.Join(kernelDir(), m)); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp"} {
		w.WriteHeader(&cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755})
	}
	for _, f := range []struct {
		name string
		mode cpio.FileMode
		body []byte
	}{{"init", 0o755, []byte(initScript)}, {"bin/busybox", 0o755, bb}, {"qemu_fw_cfg.ko", 0o644, mods["qemu_fw_cfg.ko"]},
		{"button.ko", 0o644, mods["button.ko"]}, {"evdev.ko", 0o644, mods["evdev.ko"]}} {
		if err := w.WriteHeader(&cpio.Header{Name: f.name, Mode: cpio.TypeReg | f.mode, Size: int64(len(f.body))}); err != nil {
			t.Fatal(err)
		}
		w.Write(f.body)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files := vm.Files{Kernel: filepath.Join(kernelDir(), "vmlinuz"), Initrd: filepath.Join(dir, "initrd")}
	if err := os.WriteFile(files.Initrd, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if diskMB > 0 {
		files.Disk = filepath.Join(dir, "disk.qcow2")
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", files.Disk, strconv.Itoa(diskMB)+"M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v: %s", err, out)
		}
	}
	return files
}

// Driver returns a qemu driver with its state in a short temporary
// directory (unix socket paths must fit 108 bytes); at the end of the
// test its VMs are removed. Its VMs run under TCG, as TESTING.md says the
// tests do: a host may offer a /dev/kvm (nested virtualisation) under
// which a guest never prints a line, and a test must not depend on that.
func Driver(t testing.TB) *qemu.Driver {
	t.Helper()
	dir, err := os.MkdirTemp("", "q")
	if err != nil {
		t.Fatal(err)
	}
	d, err := qemu.New(qemu.Config{StateDir: dir, Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		list, _ := d.List(context.Background())
		for _, in := range list {
			d.Remove(context.Background(), in.Name)
		}
		os.RemoveAll(dir)
	})
	return d
}
