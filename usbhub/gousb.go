//go:build gousb && cgo && linux

package usbhub

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/gousb"
)

// HubPower reads hub descriptors and switches port power with hub class
// requests through libusb (gousb). Only hubs are opened, never keys.
type HubPower struct {
	ctx *gousb.Context

	mu    sync.Mutex
	cache map[string]bool // hub path -> switches ports one by one
}

// NewHubPower opens libusb; Close releases it.
func NewHubPower() *HubPower { return &HubPower{ctx: gousb.NewContext(), cache: map[string]bool{}} }

// Close releases libusb.
func (h *HubPower) Close() error { return h.ctx.Close() }

// openHub opens the hub at bus and path (empty: the root hub).
func (h *HubPower) openHub(bus int, path []int) (*gousb.Device, error) {
	devs, err := h.ctx.OpenDevices(func(d *gousb.DeviceDesc) bool {
		return d.Class == gousb.ClassHub && d.Bus == bus && slices.Equal(d.Path, path)
	})
	for _, d := range devs[min(1, len(devs)):] {
		d.Close()
	}
	if len(devs) == 0 {
		if err == nil {
			err = fmt.Errorf("usbhub: no hub at bus %d path %v", bus, path)
		}
		return nil, err
	}
	return devs[0], nil
}

// Switchable says whether the hub above port switches its ports' power
// one by one, from the hub's descriptor.
func (h *HubPower) Switchable(port string) bool {
	bus, hub, _, err := splitPort(port)
	if err != nil {
		return false
	}
	key := fmt.Sprint(bus, hub)
	h.mu.Lock()
	defer h.mu.Unlock()
	if v, ok := h.cache[key]; ok {
		return v
	}
	dev, err := h.openHub(bus, hub)
	if err != nil {
		return false
	}
	defer dev.Close()
	desc := make([]byte, 32)
	v := false
	for _, typ := range []uint16{hubDescriptorUSB3, hubDescriptorUSB2} {
		// GET_DESCRIPTOR, class, device: the hub descriptor.
		if n, err := dev.Control(0xa0, 0x06, typ<<8, 0, desc); err == nil {
			v, _, err = perPortPower(desc[:n])
			if err == nil {
				break
			}
		}
	}
	h.cache[key] = v
	return v
}

// PowerCycle switches port's power off (ClearPortFeature PORT_POWER) for
// a second, then on (SetPortFeature PORT_POWER).
func (h *HubPower) PowerCycle(ctx context.Context, port string) error {
	if !h.Switchable(port) {
		return ErrNotSwitchable
	}
	bus, hub, n, err := splitPort(port)
	if err != nil {
		return err
	}
	dev, err := h.openHub(bus, hub)
	if err != nil {
		return err
	}
	defer dev.Close()
	if _, err := dev.Control(hubRequestType, hubClearFeature, hubFeaturePower, uint16(n), nil); err != nil {
		return fmt.Errorf("usbhub: switching %s off: %w", port, err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
	if _, err := dev.Control(hubRequestType, hubSetFeature, hubFeaturePower, uint16(n), nil); err != nil {
		return fmt.Errorf("usbhub: switching %s on again: %w", port, err)
	}
	return ctx.Err()
}
