//go:build !linux

package usbip

import (
	"context"
	"net"
	"runtime"

	"github.com/edgebox/edgebox/errdefs"
)

// Attach is Linux's: vhci-hcd is the Linux kernel's USB/IP client. (On
// Windows, usbip-win2 attaches from the loopback server instead.) It
// closes conn.
func (v VHCI) Attach(ctx context.Context, conn net.Conn, busID string) (int, error) {
	conn.Close()
	return 0, errdefs.Unavailable("usbip: attaching %s: vhci-hcd is the Linux kernel's, and this is %s", busID, runtime.GOOS)
}

// Detach is Linux's, as Attach is.
func (v VHCI) Detach(port int) error {
	return errdefs.Unavailable("usbip: detaching vhci port %d: vhci-hcd is the Linux kernel's, and this is %s", port, runtime.GOOS)
}
