//go:build linux

// Package vmtest builds a tiny guest for the QEMU tests: Debian's kernel
// (unpacked by scripts/test-deps.sh) and an initramfs of Debian's static
// busybox whose init says hello with the GREETING it finds in fw_cfg, then
// idles until the ACPI power button powers it off. Under TCG it is up in a few seconds.
//
// With the virtio-net modules unpacked too, a guest with a NIC prints its
// MAC (MACLine), takes its address from fw_cfg (opt/edgebox/net, a bridged
// VM, unless its DHCP variable is set) or by DHCP, prints it (AddrLine), serves HTTP on port 80
// with the page Page, and fetches the URL in its FETCH variable, printing
// what it got after FetchedLine.
//
// USBFiles and USBWatchFiles build guests on Debian's generic kernel,
// which has USB: they print the devices on their xHCI bus (USBLine).
// USBIPFiles builds one with the kernel's USB/IP client (vhci-hcd) and a
// NIC on QEMU's user network, which runs a test's program once.
package vmtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// What a guest with a NIC prints, each followed by a value and a newline.
const (
	MACLine     = "edgebox-guest mac "
	AddrLine    = "edgebox-guest address "
	FetchedLine = "edgebox-guest fetched "
)

// Page is what the guest's web server answers on port 80.
const Page = "hello from the guest"

// NetModules are the kernel modules of a virtio NIC, in load order.
var NetModules = []string{"virtio_ring.ko", "virtio.ko", "virtio_pci_legacy_dev.ko", "virtio_pci_modern_dev.ko",
	"virtio_pci.ko", "failover.ko", "net_failover.ko", "virtio_net.ko"}

// RequireNet is Require for a guest with a network card.
func RequireNet(t testing.TB) {
	t.Helper()
	Require(t)
	for _, m := range NetModules {
		require.File(t, filepath.Join(kernelDir(), m), "the kernel's virtio-net modules; scripts/test-deps.sh unpacks them")
	}
}

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

// dhcpScript is udhcpc's: it sets the address and route it got.
const dhcpScript = `#!/bin/busybox sh
case "$1" in
bound|renew)
	ifconfig "$interface" "$ip" netmask "$subnet" up
	for r in $router; do route add default gw "$r" dev "$interface"; break; done
	;;
esac
`

var initScript = `#!/bin/busybox sh
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
for m in ` + strings.Join(NetModules, " ") + `; do
	[ -f /$m ] && insmod /$m
done
ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
	echo "` + MACLine + `$(cat /sys/class/net/eth0/address)"
	ip link set eth0 up
	net=/sys/firmware/qemu_fw_cfg/by_name/opt/edgebox/net/raw
	if [ -f $net ] && [ -z "$DHCP" ]; then
		addr=$(sed -n 's/^ip=//p' $net)
		gw=$(sed -n 's/^gateway=//p' $net)
		ip addr add $addr dev eth0
		ip route add default via $gw
	else
		udhcpc -i eth0 -q -n -t 20 -T 1 -s /dhcp.sh >/dev/null 2>&1
	fi
	echo "` + AddrLine + `$(ip -4 -o addr show dev eth0 | awk '{print $4}')"
	mkdir -p /www
	echo "` + Page + `" >/www/index.html
	httpd -p 80 -h /www
	if [ -n "$FETCH" ]; then
		i=0
		until got=$(timeout 20 wget -q -O - "$FETCH") || [ $i -ge 10 ]; do sleep 1; i=$((i+1)); done
		echo "` + FetchedLine + `$got"
	fi
fi
# A shell on the second serial port, for remote sessions; another when
# it exits.
(while :; do setsid sh -c 'exec sh -i </dev/ttyS1 >/dev/ttyS1 2>&1'; sleep 0.2; done) &
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
	for _, m := range NetModules {
		// Optional: only guests with a NIC need them (RequireNet).
		if b, err := os.ReadFile(filepath.Join(kernelDir(), m)); err == nil {
			mods[m] = b
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
	}{{"init", 0o755, []byte(initScript)}, {"dhcp.sh", 0o755, []byte(dhcpScript)}, {"bin/busybox", 0o755, bb},
		{"qemu_fw_cfg.ko", 0o644, mods["qemu_fw_cfg.ko"]}, {"button.ko", 0o644, mods["button.ko"]}, {"evdev.ko", 0o644, mods["evdev.ko"]}} {
		if err := w.WriteHeader(&cpio.Header{Name: f.name, Mode: cpio.TypeReg | f.mode, Size: int64(len(f.body))}); err != nil {
			t.Fatal(err)
		}
		w.Write(f.body)
	}
	for _, m := range NetModules {
		if b, ok := mods[m]; ok {
			if err := w.WriteHeader(&cpio.Header{Name: m, Mode: cpio.TypeReg | 0o644, Size: int64(len(b))}); err != nil {
				t.Fatal(err)
			}
			w.Write(b)
		}
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
func Driver(t testing.TB) *qemu.Driver { return DriverWith(t, qemu.Config{}) }

// DriverWith is Driver with cfg's network, log and extra arguments.
func DriverWith(t testing.TB, cfg qemu.Config) *qemu.Driver {
	t.Helper()
	dir, err := os.MkdirTemp("", "q")
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir, cfg.Accel = dir, "tcg"
	d, err := qemu.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		removeVMs(d)
		os.RemoveAll(dir)
	})
	return d
}

// RemoveVMsAtEnd removes, once the test and the cleanups registered after
// this one are done, the VMs a QEMU driver started in stateDir: those of
// an agent binary, which leaves its VMs running when it stops, as it must.
func RemoveVMsAtEnd(t testing.TB, stateDir string) {
	t.Cleanup(func() {
		if d, err := qemu.New(qemu.Config{StateDir: stateDir}); err == nil {
			removeVMs(d)
		}
	})
}

func removeVMs(d *qemu.Driver) {
	list, _ := d.List(context.Background())
	for _, in := range list {
		d.Remove(context.Background(), in.Name)
	}
}

// USBModules are the modules of an xHCI bus in Debian's generic kernel,
// in load order.
var USBModules = []string{"usb-common.ko", "usbcore.ko", "xhci-hcd.ko", "xhci-pci.ko"}

// USBLine starts what a USB guest prints of each device on its bus that
// is not a hub: "USB VID:PID SERIAL BUS/DEV".
const USBLine = "USB "

// usbInit is a USB guest's init: it loads the xHCI modules, waits for a
// device on the bus, prints it, runs /run-usb with the device's usbfs
// node when the test gave one, and powers off.
const usbInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in usb-common usbcore xhci-hcd xhci-pci; do insmod /$m.ko; done
for i in $(seq 1 200); do
	for d in /sys/bus/usb/devices/*; do
		[ -f $d/idVendor ] && [ "$(cat $d/bDeviceClass)" != "09" ] && found=$d
	done
	[ -n "$found" ] && break
	sleep 0.1
done
if [ -n "$found" ]; then
	node=$(printf '/dev/bus/usb/%03d/%03d' $(cat $found/busnum) $(cat $found/devnum))
	echo "USB $(cat $found/idVendor):$(cat $found/idProduct) $(cat $found/serial) $node"
	[ -x /run-usb ] && /run-usb $node
else
	echo "NO USB DEVICE"
fi
echo "USB GUEST DONE"
poweroff -f
`

// RequireUSB is Require for a guest with a USB bus: Debian's generic
// kernel and its xHCI modules (scripts/test-deps.sh unpacks them).
func RequireUSB(t testing.TB) {
	t.Helper()
	Require(t)
	require.File(t, filepath.Join(kernelDir(), "usb", "vmlinuz"), "Debian's generic kernel; scripts/test-deps.sh unpacks it")
	for _, m := range USBModules {
		require.File(t, filepath.Join(kernelDir(), "usb", m), "the generic kernel's USB modules; scripts/test-deps.sh unpacks them")
	}
}

// USBFiles writes a guest with a USB bus into dir: the generic kernel and
// an initramfs whose init prints the first device on the bus (USBLine),
// and gives its usbfs node to program, when not nil, a static binary it
// runs as /run-usb.
func USBFiles(t testing.TB, dir string, program []byte) vm.Files {
	t.Helper()
	RequireUSB(t)
	return usbGuest(t, dir, usbInit, USBModules, program)
}

// What a USB watching guest (USBWatchFiles) prints. USBWatching once it
// watches its bus; a device that goes is USBGoneLine and "VID:PID
// SERIAL". A device that comes is USBLine as in USBFiles; USBGoneLine
// starts with USBLine too, so look for it first.
const (
	USBWatching = "USB WATCHING"
	USBGoneLine = "USB GONE "
)

// usbWatchInit is a USB watching guest's init: it loads the xHCI
// modules, then looks at its bus every 0.2 s and prints each device that
// is not a hub as it comes (starting /run-usb with its usbfs node, when
// the test gave one, in the background: it may run as long as the
// device does) and as it goes. A device is
// known by its sysfs name and its device number, which every plug
// changes. It never powers off by itself.
const usbWatchInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in usb-common usbcore xhci-hcd xhci-pci; do insmod /$m.ko; done
mkdir -p /tmp/seen
echo "` + USBWatching + `"
while :; do
	now=" "
	for d in /sys/bus/usb/devices/*; do
		[ -f $d/idVendor ] || continue
		[ "$(cat $d/bDeviceClass 2>/dev/null)" = "09" ] && continue
		bus=$(cat $d/busnum 2>/dev/null)
		dev=$(cat $d/devnum 2>/dev/null)
		[ -n "$bus" ] && [ -n "$dev" ] || continue
		key="${d##*/}_$dev"
		now="$now$key "
		[ -f /tmp/seen/$key ] && continue
		desc="$(cat $d/idVendor 2>/dev/null):$(cat $d/idProduct 2>/dev/null) $(cat $d/serial 2>/dev/null)"
		echo "$desc" >/tmp/seen/$key
		node=$(printf '/dev/bus/usb/%03d/%03d' $bus $dev)
		i=0
		while [ ! -e $node ] && [ $i -lt 20 ]; do sleep 0.05; i=$((i+1)); done
		echo "` + USBLine + `$desc $node"
		[ -x /run-usb ] && (/run-usb $node &)
	done
	for f in /tmp/seen/*; do
		[ -f "$f" ] || continue
		case "$now" in
		*" ${f##*/} "*) ;;
		*) echo "` + USBGoneLine + `$(cat $f)"; rm -f "$f" ;;
		esac
	done
	sleep 0.2
done
`

// USBWatchFiles writes a USB guest into dir, as USBFiles, whose init
// stays running: it prints every device that comes on its bus (USBLine)
// and goes (USBGoneLine), and runs program, when not nil, on each that
// comes. Its kernel command line is Cmdline; give it 256 MiB.
func USBWatchFiles(t testing.TB, dir string, program []byte) vm.Files {
	t.Helper()
	RequireUSB(t)
	return usbGuest(t, dir, usbWatchInit, USBModules, program)
}

// usbGuest writes into dir the generic kernel's guest with init, the
// kernel modules named, and program, when not nil, as /run-usb.
func usbGuest(t testing.TB, dir, init string, modules []string, program []byte) vm.Files {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp"} {
		w.WriteHeader(&cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755})
	}
	add := func(name string, mode cpio.FileMode, body []byte) {
		if err := w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | mode, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		w.Write(body)
	}
	add("init", 0o755, []byte(init))
	add("bin/busybox", 0o755, bb)
	for _, m := range modules {
		b, err := os.ReadFile(filepath.Join(kernelDir(), "usb", m))
		if err != nil {
			t.Fatal(err)
		}
		add(m, 0o644, b)
	}
	if program != nil {
		add("run-usb", 0o755, program)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files := vm.Files{Kernel: filepath.Join(kernelDir(), "usb", "vmlinuz"), Initrd: filepath.Join(dir, "usb-initrd")}
	if err := os.WriteFile(files.Initrd, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return files
}

// USBIPModules are the generic kernel's modules of its USB/IP client,
// vhci-hcd, and of the e1000 NIC (QEMU's -device e1000) a USB/IP guest
// reaches its server with, in load order (modinfo's depends: usbip-core
// on usb-common, vhci-hcd on usbip-core and usbcore, e1000 on nothing).
var USBIPModules = []string{"usb-common.ko", "usbcore.ko", "usbip-core.ko", "vhci-hcd.ko", "e1000.ko"}

// HostFromGuest is the host as a guest on QEMU's user network (-netdev
// user) sees it: a connection to it reaches the host's loopback.
const HostFromGuest = "10.0.2.2"

// USBIPGuestAddr is a USB/IP guest's address on QEMU's user network,
// with its mask.
const USBIPGuestAddr = "10.0.2.15/24"

// USBIPDone starts what a USB/IP guest prints once its program has run,
// followed by the program's exit status.
const USBIPDone = "USBIP GUEST DONE "

// usbipInit is a USB/IP guest's init: it loads vhci-hcd and the e1000
// driver, brings its NIC up at USBIPGuestAddr with HostFromGuest as
// gateway, runs /run-usb (with the environment the kernel command line
// gave init), prints USBIPDone and its status, and powers off.
const usbipInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in usb-common usbcore usbip-core vhci-hcd e1000; do
	insmod /$m.ko || echo "USBIP GUEST: insmod $m failed"
done
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
ip link set lo up
ip link set eth0 up
ip addr add ` + USBIPGuestAddr + ` dev eth0
ip route add default via ` + HostFromGuest + `
/run-usb
echo "` + USBIPDone + `$?"
poweroff -f
`

// RequireUSBIP is RequireUSB for a guest with the kernel's USB/IP client
// and a NIC: the generic kernel's USBIPModules (scripts/test-deps.sh
// unpacks them).
func RequireUSBIP(t testing.TB) {
	t.Helper()
	RequireUSB(t)
	for _, m := range USBIPModules {
		require.File(t, filepath.Join(kernelDir(), "usb", m), "the generic kernel's vhci-hcd and e1000 modules; scripts/test-deps.sh unpacks them")
	}
}

// USBIPFiles writes into dir a guest on the generic kernel with vhci-hcd
// loaded and an e1000 NIC up at USBIPGuestAddr, routed through
// HostFromGuest. Its init runs program, a static binary, once, with the
// variables (NAME=value) of the kernel command line in its environment,
// then prints USBIPDone and powers off. Boot it with 256 MiB and
// "-netdev user,id=n -device e1000,netdev=n,romfile=".
func USBIPFiles(t testing.TB, dir string, program []byte) vm.Files {
	t.Helper()
	RequireUSBIP(t)
	return usbGuest(t, dir, usbipInit, USBIPModules, program)
}

// GuestProgram builds the program in dir, a directory of this module
// such as "usbhub/usbredir/testdata/apdu", as a static Linux binary for a
// guest's initramfs, and returns it.
func GuestProgram(t testing.TB, dir string) []byte {
	t.Helper()
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("finding the module: %v", err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(dir))
	build := exec.Command("go", "build", "-o", out, "./"+dir)
	build.Dir = strings.TrimSpace(string(root))
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the guest's program %s: %v\n%s", dir, err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
