//go:build gousb && cgo && linux

package main

import (
	"os"

	"github.com/edgebox/edgebox/usbhub"
)

// platformHub is sysfs for the inventory, with hub class requests through
// libusb for port power (built with -tags gousb).
func platformHub() usbhub.Hub {
	if _, err := os.Stat("/sys/bus/usb/devices"); err == nil {
		return usbhub.Sysfs{Power: usbhub.NewHubPower()}
	}
	return nil
}
