//go:build !windows && !(gousb && cgo && linux)

package main

import (
	"os"

	"github.com/edgebox/edgebox/usbhub"
)

// platformHub is sysfs where the kernel has USB, else none.
func platformHub() usbhub.Hub {
	if _, err := os.Stat("/sys/bus/usb/devices"); err == nil {
		return usbhub.Sysfs{}
	}
	return nil
}
