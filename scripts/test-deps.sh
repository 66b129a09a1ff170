#!/bin/sh
# Installs what edgebox's tests and code generation need. Idempotent: it
# installs only what is missing. Needs root for apt (or sudo).
set -eu

GO_PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GO_PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
# systemd for systemd-analyze (no daemon starts), lintian and rpm to check
# the packages, curl and util-linux (unshare) for the install script test.
# containerd, runc and busybox-static for the containerd driver's tests
# (they start their own daemon); QEMU for the qemu driver's; libusb for
# the hub power switching built with -tags gousb.
# Chromium runs the web console's browser tests, driven by
# playwright-core (never a downloaded browser). asciinema plays the
# console's session recordings. usbip (the kernel project's tool, with
# hwdata's USB IDs) is a real client of the box's USB/IP server.
# HAProxy, in TCP mode, is the load balancer in front of console replicas.
APT_PACKAGES="protobuf-compiler libprotobuf-dev systemd lintian rpm curl util-linux ca-certificates containerd runc busybox-static qemu-system-x86 qemu-utils libusb-1.0-0-dev pkg-config containernetworking-plugins iproute2 iptables chromium fonts-dejavu-core asciinema usbip hwdata haproxy"
# Node and npm build the web console (make web): Debian's, unless the
# machine has its own.
command -v node >/dev/null 2>&1 || APT_PACKAGES="$APT_PACKAGES nodejs"
command -v npm >/dev/null 2>&1 || APT_PACKAGES="$APT_PACKAGES npm"

missing=""
for p in $APT_PACKAGES; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "test-deps: installing$missing"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# A Debian kernel for the VM boot tests: only its vmlinuz and the modules
# for fw_cfg, the ACPI power button and a virtio NIC, unpacked from the package (never installed: that would build an
# initramfs for this machine).
KERNEL_DIR=${EDGEBOX_TEST_KERNEL_DIR:-/var/cache/edgebox-test/kernel}
if [ ! -f "$KERNEL_DIR/vmlinuz" ] || [ ! -f "$KERNEL_DIR/qemu_fw_cfg.ko" ] || [ ! -f "$KERNEL_DIR/button.ko" ] || [ ! -f "$KERNEL_DIR/virtio_net.ko" ]; then
	pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
	echo "test-deps: unpacking $pkg into $KERNEL_DIR"
	tmp=$(mktemp -d)
	chmod 1777 "$tmp" # apt downloads as _apt
	(cd "$tmp" && apt-get download -q "$pkg" >/dev/null && dpkg-deb --fsys-tarfile ./*.deb | tar -x --wildcards './boot/vmlinuz-*' \
		'./lib/modules/*/kernel/drivers/firmware/qemu_fw_cfg.ko' './lib/modules/*/kernel/drivers/acpi/button.ko' \
		'./lib/modules/*/kernel/drivers/input/evdev.ko' './lib/modules/*/kernel/drivers/virtio/virtio*.ko' \
		'./lib/modules/*/kernel/net/core/failover.ko' './lib/modules/*/kernel/drivers/net/net_failover.ko' \
		'./lib/modules/*/kernel/drivers/net/virtio_net.ko')
	mkdir -p "$KERNEL_DIR"
	cp "$tmp"/boot/vmlinuz-* "$KERNEL_DIR/vmlinuz"
	cp "$tmp"/lib/modules/*/kernel/drivers/firmware/qemu_fw_cfg.ko "$tmp"/lib/modules/*/kernel/drivers/acpi/button.ko \
		"$tmp"/lib/modules/*/kernel/drivers/input/evdev.ko "$tmp"/lib/modules/*/kernel/drivers/virtio/virtio*.ko \
		"$tmp"/lib/modules/*/kernel/net/core/failover.ko "$tmp"/lib/modules/*/kernel/drivers/net/net_failover.ko \
		"$tmp"/lib/modules/*/kernel/drivers/net/virtio_net.ko "$KERNEL_DIR/"
	rm -rf "$tmp"
fi

# Debian's generic kernel, for the guests that need USB (the cloud kernel
# has none): its vmlinuz and the modules of an xHCI bus, of the kernel's
# USB/IP client (usbip-core, vhci-hcd) and of an e1000 NIC (no
# dependencies) to reach its server, unpacked the same way into
# $KERNEL_DIR/usb. All of them at once, from one package: a module loads
# only into the kernel it was built with.
USB_MODULES="drivers/usb/common/usb-common.ko drivers/usb/core/usbcore.ko drivers/usb/host/xhci-hcd.ko drivers/usb/host/xhci-pci.ko drivers/usb/usbip/usbip-core.ko drivers/usb/usbip/vhci-hcd.ko drivers/net/ethernet/intel/e1000/e1000.ko"
usb_missing=""
[ -f "$KERNEL_DIR/usb/vmlinuz" ] || usb_missing=vmlinuz
for m in $USB_MODULES; do
	[ -f "$KERNEL_DIR/usb/${m##*/}" ] || usb_missing="$usb_missing ${m##*/}"
done
if [ -n "$usb_missing" ]; then
	pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
	echo "test-deps: unpacking $pkg into $KERNEL_DIR/usb (for$usb_missing)"
	tmp=$(mktemp -d)
	chmod 1777 "$tmp"
	patterns=""
	for m in $USB_MODULES; do patterns="$patterns ./lib/modules/*/kernel/$m"; done
	# The patterns are tar's, one word each: not globbed here (set -f).
	# shellcheck disable=SC2086
	(cd "$tmp" && apt-get download -q "$pkg" >/dev/null && deb=$(echo ./*.deb) && set -f &&
		dpkg-deb --fsys-tarfile "$deb" | tar -x --wildcards './boot/vmlinuz-*' $patterns)
	mkdir -p "$KERNEL_DIR/usb"
	for m in $USB_MODULES; do
		cp "$tmp"/lib/modules/*/kernel/"$m" "$KERNEL_DIR/usb/"
	done
	cp "$tmp"/boot/vmlinuz-* "$KERNEL_DIR/usb/vmlinuz"
	rm -rf "$tmp"
fi

GOBIN=$(go env GOPATH)/bin
[ -x "$GOBIN/protoc-gen-go" ] && "$GOBIN/protoc-gen-go" --version 2>/dev/null | grep -q v1.36.12 || go install "$GO_PROTOC_GEN_GO"
[ -x "$GOBIN/protoc-gen-go-grpc" ] && "$GOBIN/protoc-gen-go-grpc" --version 2>/dev/null | grep -q 1.6.2 || go install "$GO_PROTOC_GEN_GO_GRPC"
# The web console's build and browser-test packages, exactly as locked.
WEB=$(dirname "$0")/../web
if [ ! -d "$WEB/node_modules/playwright-core" ] || [ "$WEB/package-lock.json" -nt "$WEB/node_modules/.package-lock.json" ]; then
	(cd "$WEB" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
echo "test-deps: ready"
