package usbip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// The kernel's own USB/IP client is vhci-hcd (drivers/usb/usbip): a
// virtual host controller whose ports take devices from USB/IP servers.
// Userspace does the import on a TCP connection, then hands the
// connection's socket to the kernel by writing "PORT SOCKFD DEVID SPEED"
// to the controller's attach file in sysfs; the device then appears on
// the vhci's USB bus, with its usbfs node, as any other. Writing PORT to
// the detach file unplugs it. This is how the box gives a key, served on
// loopback or imported from another box, to a container.
//
// What vhci_hcd.0 shows (drivers/usb/usbip/vhci_sysfs.c): one status
// file per controller (status, status.1, … status.N-1), a header line
// then one line per port, first the high-speed hub's ports ("hs", for
// USB 2 and slower devices), then the SuperSpeed hub's ("ss"):
//
//	hub port sta spd dev      sockfd local_busid
//	hs  0000 004 000 00000000 000000 0-0
//	hs  0001 006 002 00010002 000003 3-2
//	ss  0015 004 000 00000000 000000 0-0
//
// sta is the port's state (4: free; 5: attached, not yet enumerated; 6:
// in use; 7: in error), spd and dev the device's speed and ID, sockfd the
// number userspace wrote, local_busid the device's name on this host's
// USB bus once enumerated.

// DefaultVHCIDir is the first vhci-hcd controller's directory in sysfs,
// where the status, attach and detach files of all its controllers are.
const DefaultVHCIDir = "/sys/devices/platform/vhci_hcd.0"

// Bounds on what the status files say. Linux allows at most 128
// controllers (CONFIG_USBIP_VHCI_NR_HCS) of at most 2×15 ports
// (CONFIG_USBIP_VHCI_HC_PORTS, per hub); Debian's kernel has 8 of 2×15.
const (
	maxVHCIControllers = 128
	maxVHCIPorts       = maxVHCIControllers * 2 * 15
	// maxVHCIStatus bounds one status file: 31 lines of about 40 bytes.
	maxVHCIStatus = 64 << 10
	// attachTries bounds the attaches that lose a port to another
	// attach between reading the status and writing (EBUSY), as the
	// usbip tool retries them.
	attachTries = 8
)

// Port states in a status file (enum usbip_device_status).
const (
	vdevFree        = 4 // VDEV_ST_NULL
	vdevNotAssigned = 5 // VDEV_ST_NOTASSIGNED: attached, not enumerated yet
	vdevUsed        = 6 // VDEV_ST_USED
	vdevError       = 7 // VDEV_ST_ERROR
)

// Speeds vhci-hcd takes beyond usbdev's (enum usb_device_speed): a
// SuperSpeed device goes on the "ss" hub, every other on "hs"; SuperSpeed+
// (6) and unknown (0) it refuses.
const (
	speedWireless = 4
	speedSuper    = 5
)

// VHCI is the kernel's vhci-hcd as its sysfs directory shows it. Its zero
// value is the real one; a test points Dir at a directory imitating it.
// Attaching and detaching need root. A VHCI holds no state: any number
// may be used at once, and the kernel settles two attaches racing for a
// port (the loser tries the next free one).
type VHCI struct {
	// Dir is vhci_hcd.0's directory; empty means DefaultVHCIDir.
	Dir string
}

// VHCIPort is one port of a vhci-hcd controller, as its status file says.
type VHCIPort struct {
	// Port is the number attach and detach take.
	Port int
	// Super says the port is on the SuperSpeed hub ("ss"); else it is on
	// the high-speed hub ("hs"), which takes USB 2 and slower devices.
	Super bool
	// Free says nothing is attached.
	Free bool
	// For an attached device: its speed, its ID as its server numbered
	// it (busnum<<16 | devnum), and, once the kernel enumerated it, its
	// name on this host's USB bus ("3-1": /sys/bus/usb/devices/3-1).
	Speed usbdev.Speed
	DevID uint32
	BusID string
}

// AttachVHCI imports busID from the USB/IP server at the other end of
// conn, a TCP connection, and attaches it to a free port of the kernel's
// vhci-hcd, whose number it returns: the device then appears on this
// host's USB bus (VHCI.Ports says where once the kernel has enumerated
// it). It always closes conn: on success the kernel holds the connection
// until DetachVHCI, or until the server ends it. It needs root, and
// Linux with vhci-hcd loaded. See VHCI.Attach.
func AttachVHCI(ctx context.Context, conn net.Conn, busID string) (int, error) {
	return VHCI{}.Attach(ctx, conn, busID)
}

// DetachVHCI unplugs the device on port (as AttachVHCI returned it) and
// ends its connection. See VHCI.Detach.
func DetachVHCI(port int) error { return VHCI{}.Detach(port) }

func (v VHCI) dir() string {
	if v.Dir != "" {
		return v.Dir
	}
	return DefaultVHCIDir
}

// errNoVHCI is the error for a host without vhci-hcd, path the file
// missing.
func errNoVHCI(path string) error {
	return errdefs.Unavailable("usbip: this kernel has no vhci-hcd (%s is missing): modprobe vhci-hcd", path)
}

// Ports returns every port of every vhci-hcd controller, in the order
// the status files list them. Errors: errdefs.ErrUnavailable without
// vhci-hcd; errdefs.ErrInvalid for a status file it cannot read as one.
func (v VHCI) Ports() ([]VHCIPort, error) {
	var all []VHCIPort
	seen := map[int]bool{}
	for i := 0; i < maxVHCIControllers; i++ {
		name := "status"
		if i > 0 {
			name = "status." + strconv.Itoa(i)
		}
		path := filepath.Join(v.dir(), name)
		b, err := readBounded(path, maxVHCIStatus)
		if errors.Is(err, os.ErrNotExist) {
			if i == 0 {
				return nil, errNoVHCI(path)
			}
			break
		}
		if errors.Is(err, errdefs.ErrInvalid) {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("usbip: reading vhci-hcd's ports: %w", err)
		}
		ports, err := parseVHCIStatus(b)
		if err != nil {
			return nil, errdefs.Invalid("usbip: %s: %w", path, err)
		}
		for _, p := range ports {
			if seen[p.Port] {
				return nil, errdefs.Invalid("usbip: %s: port %d is listed twice", path, p.Port)
			}
			seen[p.Port] = true
		}
		all = append(all, ports...)
	}
	return all, nil
}

// readBounded reads the file at path, refusing one past limit bytes.
func readBounded(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, errdefs.Invalid("usbip: %s is longer than %d bytes", path, limit)
	}
	return b, nil
}

// vhciStatusHeader starts a status file.
const vhciStatusHeader = "hub port sta spd dev"

// parseVHCIStatus reads one status file: its header, then its ports.
func parseVHCIStatus(b []byte) ([]VHCIPort, error) {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if !strings.HasPrefix(lines[0], vhciStatusHeader) {
		return nil, fmt.Errorf("the status does not start with %q", vhciStatusHeader)
	}
	ports := make([]VHCIPort, 0, len(lines)-1)
	for n, line := range lines[1:] {
		p, err := parseVHCIPort(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n+2, err)
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// parseVHCIPort reads one port's line: "hs  0001 006 002 00010002 000003 3-2".
func parseVHCIPort(line string) (VHCIPort, error) {
	f := strings.Fields(line)
	if len(f) != 7 {
		return VHCIPort{}, fmt.Errorf("%q: %d fields, not 7", line, len(f))
	}
	var p VHCIPort
	switch f[0] {
	case "hs":
	case "ss":
		p.Super = true
	default:
		return VHCIPort{}, fmt.Errorf("%q: hub %q is neither hs nor ss", line, f[0])
	}
	port, err := strconv.ParseUint(f[1], 10, 16)
	if err != nil || port >= maxVHCIPorts {
		return VHCIPort{}, fmt.Errorf("%q: port %q: 0 to %d", line, f[1], maxVHCIPorts-1)
	}
	state, err := strconv.ParseUint(f[2], 10, 16)
	if err != nil || state < vdevFree || state > vdevError {
		return VHCIPort{}, fmt.Errorf("%q: state %q: %d to %d", line, f[2], vdevFree, vdevError)
	}
	speed, err := strconv.ParseUint(f[3], 10, 8)
	if err != nil || speed > speedSuper+1 {
		return VHCIPort{}, fmt.Errorf("%q: speed %q", line, f[3])
	}
	devid, err := strconv.ParseUint(f[4], 16, 32)
	if err != nil {
		return VHCIPort{}, fmt.Errorf("%q: device %q", line, f[4])
	}
	if _, err := strconv.ParseUint(f[5], 10, 32); err != nil {
		return VHCIPort{}, fmt.Errorf("%q: sockfd %q", line, f[5])
	}
	if len(f[6]) >= busIDSize || strings.ContainsAny(f[6], "/\\") || strings.HasPrefix(f[6], ".") {
		return VHCIPort{}, fmt.Errorf("%q: bus ID %q", line, f[6])
	}
	p.Port, p.Free = int(port), state == vdevFree
	if state == vdevUsed {
		p.Speed, p.DevID, p.BusID = usbdev.Speed(speed), uint32(devid), f[6]
	} else if state == vdevNotAssigned {
		p.Speed, p.DevID = usbdev.Speed(speed), uint32(devid)
	}
	return p, nil
}

// Port returns port's state. Errors: those of Ports, and
// errdefs.ErrNotFound for a port vhci-hcd does not have.
func (v VHCI) Port(port int) (VHCIPort, error) {
	ports, err := v.Ports()
	if err != nil {
		return VHCIPort{}, err
	}
	for _, p := range ports {
		if p.Port == port {
			return p, nil
		}
	}
	return VHCIPort{}, errdefs.NotFound("usbip: vhci-hcd has no port %d", port)
}

// vhciHubSuper says which hub takes a device of speed: true for the
// SuperSpeed one. Speeds vhci-hcd refuses are errdefs.ErrInvalid.
func vhciHubSuper(speed usbdev.Speed) (bool, error) {
	switch speed {
	case usbdev.SpeedLow, usbdev.SpeedFull, usbdev.SpeedHigh, speedWireless:
		return false, nil
	case speedSuper:
		return true, nil
	}
	return false, errdefs.Invalid("usbip: vhci-hcd takes no device of speed %d (it takes 1 to %d)", speed, speedSuper)
}

// freeVHCIPort picks the first free port of the hub for speed.
func freeVHCIPort(ports []VHCIPort, speed usbdev.Speed) (int, error) {
	super, err := vhciHubSuper(speed)
	if err != nil {
		return 0, err
	}
	for _, p := range ports {
		if p.Free && p.Super == super {
			return p.Port, nil
		}
	}
	hub := "high-speed (USB 2)"
	if super {
		hub = "SuperSpeed (USB 3)"
	}
	return 0, errdefs.Unavailable("usbip: every %s port of vhci-hcd is in use (%d ports in all): detach a device, or load vhci-hcd with more (nr_hcs)", hub, len(ports))
}

// anyFree says whether any port is free.
func anyFree(ports []VHCIPort) bool {
	for _, p := range ports {
		if p.Free {
			return true
		}
	}
	return false
}

// vhciAttachLine is what attach takes: "PORT SOCKFD DEVID SPEED".
func vhciAttachLine(port int, fd uintptr, devid uint32, speed usbdev.Speed) string {
	return fmt.Sprintf("%d %d %d %d", port, fd, devid, speed)
}

// checkVHCIPort refuses a port number vhci-hcd cannot have.
func checkVHCIPort(port int) error {
	if port < 0 || port >= maxVHCIPorts {
		return errdefs.Invalid("usbip: vhci port %d: 0 to %d", port, maxVHCIPorts-1)
	}
	return nil
}
