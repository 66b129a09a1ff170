//go:build !linux

package port

import "net"

// hasSpoken reports whether bytes from the peer wait unread in c's socket;
// only Linux is asked. Elsewhere every connection without a ClientHello
// read counts as idle.
func hasSpoken(net.Conn) bool { return false }
