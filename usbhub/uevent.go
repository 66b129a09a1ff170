package usbhub

import (
	"bytes"
	"errors"
	"strings"
)

// Uevent is one kernel device event, as netlink carries it.
type Uevent struct {
	Action    string // add, remove, change, bind, unbind
	DevPath   string
	Subsystem string
	DevType   string
	Vars      map[string]string
}

// maxUevent bounds a message; the kernel's are at most 2 KiB of
// environment plus the header.
const maxUevent = 8192

// ParseUevent reads a kernel uevent message: "ACTION@DEVPATH" then
// NUL-separated KEY=VALUE pairs. Messages from udev (which start
// "libudev") are refused: edgebox listens to the kernel only.
func ParseUevent(b []byte) (Uevent, error) {
	if len(b) == 0 || len(b) > maxUevent {
		return Uevent{}, errors.New("usbhub: uevent empty or too long")
	}
	fields := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	head := string(fields[0])
	action, path, ok := strings.Cut(head, "@")
	if !ok || action == "" || path == "" || !strings.HasPrefix(path, "/") {
		return Uevent{}, errors.New("usbhub: not a kernel uevent")
	}
	u := Uevent{Action: action, DevPath: path, Vars: map[string]string{}}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(string(f), "=")
		if !ok || k == "" {
			continue
		}
		u.Vars[k] = v
	}
	u.Subsystem, u.DevType = u.Vars["SUBSYSTEM"], u.Vars["DEVTYPE"]
	if a := u.Vars["ACTION"]; a != "" && a != u.Action {
		return Uevent{}, errors.New("usbhub: uevent's action disagrees with itself")
	}
	return u, nil
}

// IsUSBDevice says whether the event is about a USB device (not one of
// its interfaces).
func (u Uevent) IsUSBDevice() bool { return u.Subsystem == "usb" && u.DevType == "usb_device" }
