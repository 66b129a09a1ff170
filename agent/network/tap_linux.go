package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A VM reaches the bridge through a tap device in a namespace of its own:
// the namespace is attached like a container's (so it gets an address,
// NAT, published ports and firewall rules from the same plugins, and
// Detach and Sweep clean it the same way), and inside it the workload's
// eth0 and a persistent tap are ports of a small bridge. The address the
// plugins gave eth0 is taken off it: the VM behind the tap holds it, with
// its own MAC, and answers for it on edgebox's bridge. The namespace's
// bridge learns no address on eth0 (see AttachTap).
const (
	// TapName is the VM's tap device inside its namespace.
	TapName = "tap0"
	// TapBridge joins the tap and eth0 inside the namespace.
	TapBridge = "br0"
)

// AttachTap makes the persistent tap TapName in the namespace at
// netnsPath, which Attach attached, and bridges it with the namespace's
// eth0. It is idempotent: a tap and bridge already there are reused, so
// a caller killed part way can call it again.
func AttachTap(netnsPath string) error {
	if !isNetns(netnsPath) {
		return fmt.Errorf("network: tap: %q is not a network namespace", netnsPath)
	}
	err := InNetns(netnsPath, func() error {
		if _, err := net.InterfaceByName(ifName); err != nil {
			return fmt.Errorf("the namespace has no %s (not attached?): %w", ifName, err)
		}
		var steps [][]string
		if _, err := net.InterfaceByName(TapName); err != nil {
			steps = append(steps, []string{"tuntap", "add", "dev", TapName, "mode", "tap", "vnet_hdr"})
		}
		if _, err := net.InterfaceByName(TapBridge); err != nil {
			steps = append(steps, []string{"link", "add", TapBridge, "type", "bridge"})
		}
		steps = append(steps, [][]string{
			{"link", "set", ifName, "master", TapBridge},
			{"link", "set", TapName, "master", TapBridge},
			// The box's bridge sends a VM's broadcasts back (hairpin
			// mode, for workloads that reach their own published ports):
			// learnt on eth0, the VM's MAC would draw its own traffic
			// back there. Nothing is learnt on eth0; what comes in on it
			// goes to the tap.
			{"link", "set", ifName, "type", "bridge_slave", "learning", "off", "fdb_flush"},
			// The VM answers for the address now; the namespace must not.
			{"addr", "flush", "dev", ifName},
			{"link", "set", TapBridge, "up"},
			{"link", "set", TapName, "up"},
			{"link", "set", ifName, "up"},
		}...)
		// One ip for all the steps: each process costs some milliseconds.
		var batch strings.Builder
		for _, s := range steps {
			batch.WriteString(strings.Join(s, " ") + "\n")
		}
		cmd := exec.Command("ip", "-batch", "-")
		cmd.Stdin = strings.NewReader(batch.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("ip -batch: %v: %s", err, strings.TrimSpace(string(out)))
		}
		// The VM's DHCP requests are answered in the namespace (the
		// caller's server on TapBridge); none goes on to the box's
		// bridge, where an egress policy would count it as refused.
		// Bridged frames meet this chain where the bridge's netfilter
		// hooks are on (br_netfilter), the case where the box's egress
		// rules see them too.
		drop := []string{"FORWARD", "-m", "physdev", "--physdev-out", ifName, "-p", "udp", "--dport", "67", "-j", "DROP"}
		if exec.Command("iptables", append([]string{"-w", "-C"}, drop...)...).Run() != nil {
			if out, err := exec.Command("iptables", append([]string{"-w", "-A"}, drop...)...).CombinedOutput(); err != nil {
				return fmt.Errorf("iptables: %v: %s", err, strings.TrimSpace(string(out)))
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("network: tap in %s: %w", netnsPath, err)
	}
	return nil
}

// OpenTap opens the tap AttachTap made, with virtio-net headers, for a
// VM's QEMU (-netdev tap,fd=N). The file works from any namespace; the
// caller hands it to QEMU and closes its own copy.
func OpenTap(netnsPath string) (*os.File, error) {
	var f *os.File
	err := InNetns(netnsPath, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening /dev/net/tun: %w", err)
		}
		var req [unix.IFNAMSIZ + 64]byte
		copy(req[:unix.IFNAMSIZ-1], TapName)
		*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
			unix.Close(fd)
			return fmt.Errorf("attaching to %s: %w", TapName, errno)
		}
		f = os.NewFile(uintptr(fd), "/dev/net/tun:"+TapName)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("network: opening the tap in %s: %w", netnsPath, err)
	}
	return f, nil
}

// RemoveTap deletes the tap and its bridge from the namespace at
// netnsPath, before the namespace goes: a persistent tap outlives the
// process that used it. A namespace or device already gone is not an
// error.
func RemoveTap(netnsPath string) error {
	if !isNetns(netnsPath) {
		return nil
	}
	err := InNetns(netnsPath, func() error {
		var errs []error
		for _, dev := range []string{TapName, TapBridge} {
			if _, err := net.InterfaceByName(dev); err != nil {
				continue
			}
			if err := ip("link", "del", dev); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return fmt.Errorf("network: removing the tap in %s: %w", netnsPath, err)
	}
	return nil
}

// ip runs iproute2's ip on the calling thread's namespace: the child is
// forked from the thread InNetns locked there.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
