//go:build gousb && cgo && linux

package usbhub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/gousb"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Open opens the key at port through libusb, for an exporter (the USB/IP
// server that serves it to a workload of another box). The kernel's
// driver of each interface is detached while the key is driven here, and
// given back when the returned device is closed (it is an io.Closer).
func (h *HubPower) Open(_ context.Context, port string) (usbdev.Device, error) {
	bus, hub, n, err := splitPort(port)
	if err != nil {
		return nil, err
	}
	path := append(slices.Clone(hub), n)
	devs, err := h.ctx.OpenDevices(func(d *gousb.DeviceDesc) bool { return d.Bus == bus && slices.Equal(d.Path, path) })
	for _, d := range devs[min(1, len(devs)):] {
		d.Close()
	}
	if len(devs) == 0 {
		if err == nil {
			err = fmt.Errorf("usbhub: no device at %s", port)
		}
		return nil, err
	}
	d := devs[0]
	if err := d.SetAutoDetach(true); err != nil {
		d.Close()
		return nil, fmt.Errorf("usbhub: the key at %s: %w", port, err)
	}
	k, err := newLibusbKey(d)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("usbhub: the key at %s: %w", port, err)
	}
	return k, nil
}

// libusbKey is a physical key driven through libusb: control transfers
// on the device, bulk and interrupt transfers on the endpoints of its
// active configuration's interfaces, each claimed when first used.
type libusbKey struct {
	dev  *gousb.Device
	info usbdev.Info

	mu    sync.Mutex
	cfg   *gousb.Config
	intfs map[int]*gousb.Interface // claimed, by number
	ins   map[uint8]*gousb.InEndpoint
	outs  map[uint8]*gousb.OutEndpoint
	owner map[uint8]int // endpoint address → its interface's number
}

var _ usbdev.Device = (*libusbKey)(nil)

func newLibusbKey(d *gousb.Device) (*libusbKey, error) {
	num, err := d.ActiveConfigNum()
	if err != nil {
		return nil, err
	}
	desc, ok := d.Desc.Configs[num]
	if !ok {
		return nil, fmt.Errorf("no descriptor of its configuration %d", num)
	}
	k := &libusbKey{dev: d, intfs: map[int]*gousb.Interface{}, ins: map[uint8]*gousb.InEndpoint{},
		outs: map[uint8]*gousb.OutEndpoint{}, owner: map[uint8]int{}}
	k.info = usbdev.Info{Vendor: uint16(d.Desc.Vendor), Product: uint16(d.Desc.Product), BCDDevice: uint16(d.Desc.Device),
		Class: uint8(d.Desc.Class), SubClass: uint8(d.Desc.SubClass), Protocol: uint8(d.Desc.Protocol),
		Configuration: uint8(num), Speed: usbdev.Speed(d.Desc.Speed)}
	for _, in := range desc.Interfaces {
		if len(in.AltSettings) == 0 {
			continue
		}
		alt := in.AltSettings[0]
		k.info.Interfaces = append(k.info.Interfaces, usbdev.Interface{Class: uint8(alt.Class), SubClass: uint8(alt.SubClass), Protocol: uint8(alt.Protocol)})
		for addr := range alt.Endpoints {
			k.owner[uint8(addr)] = in.Number
		}
	}
	if s, err := d.SerialNumber(); err == nil {
		k.info.Serial = s
	}
	if k.cfg, err = d.Config(num); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *libusbKey) Info() usbdev.Info { return k.info }

// Control runs a control transfer. Choosing the configuration or an
// interface's setting the key has already is answered here: libusb owns
// those, and a key has one of each.
func (k *libusbKey) Control(_ context.Context, s usbdev.Setup, data []byte) ([]byte, error) {
	switch {
	case s.RequestType == 0x00 && s.Request == usbdev.RequestSetConfiguration:
		if uint8(s.Value) != k.info.Configuration {
			return nil, usbdev.ErrStall
		}
		return nil, nil
	case s.RequestType == 0x01 && s.Request == usbdev.RequestSetInterface:
		if s.Value != 0 {
			return nil, usbdev.ErrStall
		}
		return nil, nil
	}
	buf := data
	if s.In() {
		buf = make([]byte, s.Length)
	}
	n, err := k.dev.Control(s.RequestType, s.Request, s.Value, s.Index, buf)
	if err != nil {
		return nil, libusbErr(err)
	}
	if s.In() {
		return buf[:n], nil
	}
	return nil, nil
}

// Transfer runs a bulk or interrupt transfer on ep.
func (k *libusbKey) Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	if ep&0x80 != 0 {
		in, err := k.in(ep)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, length)
		n, err := in.ReadContext(ctx, buf)
		if err != nil {
			return nil, libusbErr(err)
		}
		return buf[:n], nil
	}
	out, err := k.out(ep)
	if err != nil {
		return nil, err
	}
	if _, err := out.WriteContext(ctx, data); err != nil {
		return nil, libusbErr(err)
	}
	return nil, nil
}

// intf claims the interface owning endpoint ep; hold k.mu.
func (k *libusbKey) intf(ep uint8) (*gousb.Interface, error) {
	num, ok := k.owner[ep]
	if !ok {
		return nil, usbdev.ErrStall // no such endpoint
	}
	if i, ok := k.intfs[num]; ok {
		return i, nil
	}
	i, err := k.cfg.Interface(num, 0)
	if err != nil {
		return nil, err
	}
	k.intfs[num] = i
	return i, nil
}

func (k *libusbKey) in(ep uint8) (*gousb.InEndpoint, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.ins[ep]; ok {
		return e, nil
	}
	i, err := k.intf(ep)
	if err != nil {
		return nil, err
	}
	e, err := i.InEndpoint(int(ep & 0x0f))
	if err != nil {
		return nil, err
	}
	k.ins[ep] = e
	return e, nil
}

func (k *libusbKey) out(ep uint8) (*gousb.OutEndpoint, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.outs[ep]; ok {
		return e, nil
	}
	i, err := k.intf(ep)
	if err != nil {
		return nil, err
	}
	e, err := i.OutEndpoint(int(ep & 0x0f))
	if err != nil {
		return nil, err
	}
	k.outs[ep] = e
	return e, nil
}

// Close gives the interfaces back to the kernel's drivers and closes the
// device.
func (k *libusbKey) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, i := range k.intfs {
		i.Close()
	}
	clear(k.intfs)
	k.cfg.Close()
	return k.dev.Close()
}

// libusbErr is a transfer's error as usbdev says it: a stall, or what
// libusb said.
func libusbErr(err error) error {
	if errors.Is(err, gousb.ErrorPipe) || errors.Is(err, gousb.TransferStall) {
		return usbdev.ErrStall
	}
	return err
}
