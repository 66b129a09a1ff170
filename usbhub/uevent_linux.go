package usbhub

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
)

// ListenUevents sends on the returned channel each kernel uevent that
// keep accepts, until ctx ends; it is how a plug reaches the agent at
// once instead of at the next poll. The channel is closed when listening
// ends.
func ListenUevents(ctx context.Context, keep func(Uevent) bool) (<-chan Uevent, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("usbhub: netlink: %w", err)
	}
	// Group 1: the kernel's own events.
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("usbhub: netlink: %w", err)
	}
	// Reads wake up now and then to notice ctx.
	tv := unix.Timeval{Usec: 200000}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	out := make(chan Uevent, 16)
	go func() {
		defer close(out)
		defer unix.Close(fd)
		buf := make([]byte, maxUevent)
		for ctx.Err() == nil {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || n <= 0 {
				continue
			}
			// Only the kernel (port 0) is believed.
			if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
				continue
			}
			u, err := ParseUevent(buf[:n])
			if err != nil || (keep != nil && !keep(u)) {
				continue
			}
			select {
			case out <- u:
			default: // a burst: the reader re-reads the inventory anyway
			}
		}
	}()
	return out, nil
}
