package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/edgebox/edgebox/usbhub"
)

// usbInventory is the box's USB inventory: a simulated hub from simFile,
// else sysfs on Linux, else none.
func usbInventory(simFile string) (usbhub.Hub, error) {
	if simFile != "" {
		sim, err := usbhub.LoadSim(simFile)
		if err != nil {
			return nil, fmt.Errorf("--usb-sim %s: %w", simFile, err)
		}
		return sim, nil
	}
	if runtime.GOOS == "linux" {
		if _, err := os.Stat("/sys/bus/usb/devices"); err == nil {
			return usbhub.Sysfs{}, nil
		}
	}
	return nil, nil
}
