package main

import "github.com/edgebox/edgebox/usbhub"

// platformHub is Windows' USB inventory, through SetupAPI.
func platformHub() usbhub.Hub { return usbhub.NewWindows() }
