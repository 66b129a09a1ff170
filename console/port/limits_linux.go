package port

import (
	"net"
	"syscall"
)

// hasSpoken reports whether bytes from the peer wait unread in c's socket:
// a client that sent its ClientHello which the console, busy, has not
// read yet. Such a connection is not idle, whatever its age.
func hasSpoken(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	n := 0
	rc.Control(func(fd uintptr) {
		n, _, _ = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}
