package usbhub

import (
	"context"
	"time"
)

// Watch reads h's inventory every interval until ctx ends and calls emit
// for every change, first with every device present as plugged. Polling
// sysfs is cheap (no device is opened); at 500 ms a plug reaches emit
// within about half a second.
func Watch(ctx context.Context, h Hub, every time.Duration, emit func(Event)) error {
	var last []Device
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		now, err := h.Devices(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
		} else {
			for _, e := range Diff(last, now) {
				emit(e)
			}
			last = now
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
