package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent/runtime"
)

// usbMajor is the major number of Linux's USB device nodes.
const usbMajor = 189

// openDevices returns those of devs that a process on the box has open:
// a file descriptor in /proc links to the key's node (by path, as the
// box or a container sees it), or to a USB device node (major 189) of its
// number. (A simulated key's node borrows /dev/null's number: it is
// matched by path only.)
func openDevices(devs []runtime.Device) []runtime.Device {
	byPath := map[string]int{}
	byRdev := map[uint64]int{}
	for i, d := range devs {
		byPath[d.HostPath] = i
		if d.Path != "" {
			byPath[d.Path] = i
		}
		var st syscall.Stat_t
		if syscall.Stat(d.HostPath, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFCHR && unix.Major(uint64(st.Rdev)) == usbMajor {
			byRdev[uint64(st.Rdev)] = i
		}
	}
	found := map[int]bool{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, _ := os.ReadDir(fdDir)
		for _, fd := range fds {
			link := filepath.Join(fdDir, fd.Name())
			if target, err := os.Readlink(link); err == nil {
				if i, ok := byPath[target]; ok {
					found[i] = true
					continue
				}
			}
			if len(byRdev) == 0 {
				continue
			}
			var st syscall.Stat_t
			if syscall.Stat(link, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFCHR {
				if i, ok := byRdev[uint64(st.Rdev)]; ok {
					found[i] = true
				}
			}
		}
	}
	var out []runtime.Device
	for i, d := range devs {
		if found[i] {
			out = append(out, d)
		}
	}
	return out
}
