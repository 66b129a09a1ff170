package main

import (
	"fmt"

	"github.com/edgebox/edgebox/usbhub"
)

// usbInventory is the box's USB inventory: a simulated hub from simFile,
// else sysfs on Linux, SetupAPI on Windows.
func usbInventory(simFile string) (usbhub.Hub, error) {
	if simFile != "" {
		sim, err := usbhub.LoadSim(simFile)
		if err != nil {
			return nil, fmt.Errorf("--usb-sim %s: %w", simFile, err)
		}
		return sim, nil
	}
	return platformHub(), nil
}
