//go:build linux

package usbip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/edgebox/edgebox/errdefs"
)

// Attach imports busID from the USB/IP server at the other end of conn, a
// *net.TCPConn, and attaches it to the first free port of the vhci-hcd
// hub for its speed, whose number it returns. It always closes conn: on
// success the kernel holds the connection (a socket it took by its file
// descriptor, which outlives conn) until Detach, or until the server ends
// it, which frees the port. ctx bounds the import.
//
// Errors: errdefs.ErrUnavailable without vhci-hcd ("modprobe vhci-hcd"),
// with no free port, or when the server does not offer busID or another
// client has it; errdefs.ErrPermission without root; errdefs.ErrInvalid
// for a conn that is not TCP, or a device of a speed vhci-hcd does not
// take (SuperSpeed+); the import's errors otherwise.
func (v VHCI) Attach(ctx context.Context, conn net.Conn, busID string) (int, error) {
	defer conn.Close()
	tcp, ok := conn.(*net.TCPConn)
	if !ok {
		return 0, errdefs.Invalid("usbip: vhci-hcd takes a TCP connection, not a %T", conn)
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("usbip: attaching %s: %w", busID, err)
	}
	// Look before the import: without vhci-hcd or a port, the device
	// stays free on its server.
	ports, err := v.Ports()
	if err != nil {
		return 0, err
	}
	if !anyFree(ports) {
		return 0, errdefs.Unavailable("usbip: every port of vhci-hcd is in use (%d ports): detach a device, or load vhci-hcd with more (nr_hcs)", len(ports))
	}
	devid, info, err := handshake(ctx, conn, appendFixed(appendOpHeader(nil, opReqImport, 0), busID, busIDSize), opRepImport, busID)
	if err != nil {
		if errors.Is(err, errRefused) {
			return 0, errdefs.Unavailable("%w", err)
		}
		return 0, err
	}
	if _, err := vhciHubSuper(info.Speed); err != nil {
		return 0, err
	}
	attach := filepath.Join(v.dir(), "attach")
	for try := 1; ; try++ {
		port, err := freeVHCIPort(ports, info.Speed)
		if err != nil {
			return 0, err
		}
		var line string
		cerr := raw.Control(func(fd uintptr) {
			// The kernel takes the socket by its number in this
			// process's table, during the write: Control keeps fd open
			// until it returns.
			line = vhciAttachLine(port, fd, devid, info.Speed)
			err = writeSysfs(attach, line)
		})
		if cerr != nil {
			return 0, fmt.Errorf("usbip: attaching %s: %w", busID, cerr)
		}
		switch {
		case err == nil:
			return port, nil
		case errors.Is(err, syscall.EBUSY) && try < attachTries:
			// Another attach took the port since the status was read.
			if ports, err = v.Ports(); err != nil {
				return 0, err
			}
			continue
		}
		return 0, vhciWriteError(attach, line, err)
	}
}

// Detach unplugs the device on port and ends its connection: its server
// sees the client go. Errors: errdefs.ErrUnavailable without vhci-hcd;
// errdefs.ErrPermission without root; errdefs.ErrInvalid for a port
// with nothing attached, or one vhci-hcd does not have.
func (v VHCI) Detach(port int) error {
	if err := checkVHCIPort(port); err != nil {
		return err
	}
	detach := filepath.Join(v.dir(), "detach")
	if err := writeSysfs(detach, strconv.Itoa(port)); err != nil {
		if errors.Is(err, syscall.EINVAL) {
			return errdefs.Invalid("usbip: vhci port %d has no device attached (or vhci-hcd has no such port)", port)
		}
		return vhciWriteError(detach, strconv.Itoa(port), err)
	}
	return nil
}

// writeSysfs writes line to the sysfs attribute at path in one write,
// as the kernel reads it; it creates nothing.
func writeSysfs(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(line))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// vhciWriteError says why writing line to path failed, for the operator.
func vhciWriteError(path, line string, err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return errNoVHCI(path)
	case errors.Is(err, os.ErrPermission):
		return errdefs.Permission("usbip: writing %s needs root: %w", path, err)
	case errors.Is(err, syscall.EBUSY):
		return errdefs.Unavailable("usbip: vhci-hcd's ports stayed busy (%d tries): %w", attachTries, err)
	}
	return fmt.Errorf("usbip: vhci-hcd refused %q (written to %s; its reason is in the kernel log): %w", line, path, err)
}
