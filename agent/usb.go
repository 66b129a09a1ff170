package agent

import (
	"context"
	"time"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/usbhub"
)

// maxUSBReport is the most devices one report carries, as the console
// accepts them.
const maxUSBReport = 64

// watchUSB reads the box's USB inventory every poll and reports it whole
// whenever something was plugged, unplugged or changed, and once at
// start. Reading never opens a device.
func (a *Agent) watchUSB(ctx context.Context, hub usbhub.Hub, poll time.Duration) {
	var last []usbhub.Device
	first := true
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		now, err := hub.Devices(ctx)
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("reading the USB inventory", "err", err)
			}
		} else if first || len(usbhub.Diff(last, now)) > 0 {
			first, last = false, now
			a.reports.USB(usbReport(now))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func usbReport(devs []usbhub.Device) []*edgeboxv1.UsbDevice {
	out := make([]*edgeboxv1.UsbDevice, 0, min(len(devs), maxUSBReport))
	for _, d := range devs[:min(len(devs), maxUSBReport)] {
		out = append(out, &edgeboxv1.UsbDevice{Port: d.Port, Bus: uint32(d.Bus), Dev: uint32(d.Dev), VendorId: d.VendorID,
			ProductId: d.ProductID, Serial: d.Serial, Manufacturer: d.Manufacturer, Product: d.Product, Class: string(d.Class),
			Switchable: d.Switchable, Stuck: d.Stuck})
	}
	return out
}
