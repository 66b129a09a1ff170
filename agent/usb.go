package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/usbhub"
)

// maxUSBReport is the most devices one report carries, as the console
// accepts them.
const maxUSBReport = 64

// watchUSB reads the box's USB inventory every poll, and at once when the
// kernel announces a USB device, and reports it whole whenever something
// was plugged, unplugged or changed, and once at start. Reading never
// opens a device.
func (a *Agent) watchUSB(ctx context.Context, hub usbhub.Hub, poll time.Duration) {
	var last []usbhub.Device
	first := true
	healing := map[string]*healing{}
	told := map[string]bool{} // simulated keys leased to VMs, already reported
	a.makeUSBNodes(hub)
	t := time.NewTicker(poll)
	defer t.Stop()
	// The kernel announces plugs at once; polling stays as the net.
	var uevents <-chan usbhub.Uevent
	if _, ok := hub.(usbhub.Sysfs); ok {
		if ch, err := usbhub.ListenUevents(ctx, usbhub.Uevent.IsUSBDevice); err == nil {
			uevents = ch
		} else {
			a.log.Info("no kernel uevents; USB changes are found by polling", "err", err)
		}
	}
	for {
		now, err := hub.Devices(ctx)
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("reading the USB inventory", "err", err)
			}
		} else {
			now = a.withoutImported(now)
			if first || len(usbhub.Diff(last, now)) > 0 {
				first, last = false, now
				a.reports.USB(usbReport(now))
				a.reconciler.Kick() // leased keys may have moved
			}
			a.heal(ctx, hub, now, healing)
			a.refuseSimulatedToVMs(now, told)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case _, ok := <-uevents:
			if !ok {
				uevents = nil
			}
		}
	}
}

// withoutImported leaves out of devs the keys of other boxes that
// vhci-hcd put on this box's bus: they are reported by their own box.
func (a *Agent) withoutImported(devs []usbhub.Device) []usbhub.Device {
	var imported []*edgeboxv1.UsbAssignment
	for _, u := range a.assignmentsOf("") {
		if u.GetImportFrom() != "" {
			imported = append(imported, u)
		}
	}
	if len(imported) == 0 {
		return devs
	}
	out := devs[:0:0]
	for _, d := range devs {
		mine := true
		for _, u := range imported {
			if u.GetSerial() != "" && d.Serial == u.GetSerial() {
				mine = false
			}
		}
		if mine {
			out = append(out, d)
		}
	}
	return out
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

// simNodeDir is where a simulated hub makes its keys' device nodes, under
// the agent's data directory.
const simNodeDir = "usb-sim"

// makeUSBNodes has a hub that makes its keys' device nodes (the simulated
// hub) make them in the data directory, unless Config.USBDevRoot says
// where the nodes are; doing it again does nothing.
func (a *Agent) makeUSBNodes(hub usbhub.Hub) {
	if nm, ok := hub.(usbhub.NodeMaker); ok && a.cfg.USBDevRoot == "" {
		if err := nm.MakeNodes(filepath.Join(a.cfg.DataDir, simNodeDir)); err != nil {
			a.log.Warn("simulated USB keys have no device nodes; leasing one to a workload fails", "err", err)
		}
	}
}

// devicesFor returns the keys leased to workload (its UsbAssignment
// objects) where the inventory finds them now: by serial, or by port for
// keys without one. A leased key that is not plugged in is left out until
// it is back, and so is a simulated key leased to a VM, which has no USB
// device to give it (refuseSimulatedToVMs says so).
func (a *Agent) devicesFor(workload string) []runtime.Device {
	if a.cfg.USB == nil {
		return nil
	}
	mine := a.assignmentsOf(workload)
	if len(mine) == 0 {
		return nil
	}
	// The reconciler may ask before watchUSB has started.
	a.makeUSBNodes(a.cfg.USB)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	devs, err := a.cfg.USB.Devices(ctx)
	if err != nil {
		return nil
	}
	vm := a.workloadRuntimes()[workload] == edgeboxv1.RuntimeQEMU // given USB devices (QEMU's usb-host), not device nodes
	var out []runtime.Device
	for _, u := range mine {
		if u.GetExportTo() != "" || (u.GetImportFrom() != "" && (vm || u.GetSerial() == "" || !a.onVHCI(u.GetKeyId()))) {
			continue // it travels through the console (ukeys.go)
		}
		d, ok := leasedDevice(u, devs)
		if !ok || (vm && d.Simulated) {
			continue
		}
		node := fmt.Sprintf("%03d/%03d", d.Bus, d.Dev)
		host := filepath.Join(a.usbDevRoot(), node)
		if d.Node != "" && a.cfg.USBDevRoot == "" {
			host = d.Node
		}
		out = append(out, runtime.Device{KeyID: u.GetKeyId(), HostPath: host, Path: "/dev/bus/usb/" + node, Bus: d.Bus, Port: d.Port})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].KeyID < out[j].KeyID })
	return out
}

// assignmentsOf returns the UsbAssignment objects of workload; of every
// workload for "".
func (a *Agent) assignmentsOf(workload string) []*edgeboxv1.UsbAssignment {
	objs, err := a.local.Objects(edgeboxv1.KindUsbAssignment)
	if err != nil {
		return nil
	}
	var mine []*edgeboxv1.UsbAssignment
	for _, o := range objs {
		if u := o.GetUsbAssignment(); u != nil && (workload == "" || u.GetWorkload() == workload) {
			mine = append(mine, u)
		}
	}
	return mine
}

// remote reports whether assignment u is of a key used from another box
// (exported), or of another box's key used here (imported).
func remote(u *edgeboxv1.UsbAssignment) bool { return u.GetExportTo() != "" || u.GetImportFrom() != "" }

// leasedDevice finds the key of assignment u among devs.
func leasedDevice(u *edgeboxv1.UsbAssignment, devs []usbhub.Device) (usbhub.Device, bool) {
	for _, d := range devs {
		if (u.GetSerial() != "" && d.Serial == u.GetSerial()) || (u.GetSerial() == "" && d.Port == u.GetPortPath()) {
			return d, true
		}
	}
	return usbhub.Device{}, false
}

// workloadRuntimes maps each stored Workload to its runtime.
func (a *Agent) workloadRuntimes() map[string]string {
	out := map[string]string{}
	objs, _ := a.local.Objects(edgeboxv1.KindWorkload)
	for _, o := range objs {
		out[o.GetName()] = o.GetWorkload().GetRuntime()
	}
	return out
}

// refuseSimulatedToVMs reports, once per key and workload (told), each
// simulated key leased to a VM workload: it is left out of the VM, and
// the key's history says why.
func (a *Agent) refuseSimulatedToVMs(devs []usbhub.Device, told map[string]bool) {
	now := map[string]bool{}
	leases := a.assignmentsOf("")
	if len(leases) == 0 {
		clear(told)
		return
	}
	runtimes := a.workloadRuntimes()
	for _, u := range leases {
		d, ok := leasedDevice(u, devs)
		if !ok || remote(u) || !d.Simulated || runtimes[u.GetWorkload()] != edgeboxv1.RuntimeQEMU {
			continue
		}
		k := u.GetKeyId() + "/" + u.GetWorkload()
		now[k] = true
		if !told[k] {
			a.keyEvent(u.GetKeyId(), edgeboxv1.ReasonNotAttachable, fmt.Sprintf("simulated key at %s cannot be given to VM workload %s: "+
				"there is no USB device behind it for QEMU to attach; lease a real key, or run the workload as a process or container", d.Port, u.GetWorkload()), true)
		}
	}
	clear(told)
	for k := range now {
		told[k] = true
	}
}

func (a *Agent) usbDevRoot() string {
	if a.cfg.USBDevRoot != "" {
		return a.cfg.USBDevRoot
	}
	return "/dev/bus/usb"
}

// Self-healing of stuck keys: a leased key that stops answering is
// power-cycled through its hub port, at most maxCycles times, healCooldown
// apart; then it is reported broken and left alone until it answers again.
const (
	maxCycles    = 3
	healCooldown = 3 * time.Second
)

type healing struct {
	cycles int
	last   time.Time
	broken bool
}

// heal power-cycles the stuck leased keys among devs and reports what it
// did as events of the key.
func (a *Agent) heal(ctx context.Context, hub usbhub.Hub, devs []usbhub.Device, state map[string]*healing) {
	leased := a.leasedKeys()
	for _, d := range devs {
		keyID := leased[d.Serial]
		if d.Serial == "" {
			keyID = leased["port:"+d.Port]
		}
		suspect := a.takeSuspect(keyID)
		if (!d.Stuck && !suspect) || keyID == "" {
			if !d.Stuck {
				delete(state, d.Port)
			}
			continue
		}
		h := state[d.Port]
		if h == nil {
			h = &healing{}
			state[d.Port] = h
		}
		if h.broken || time.Since(h.last) < healCooldown {
			continue
		}
		if !d.Switchable {
			h.broken = true
			a.keyEvent(keyID, edgeboxv1.ReasonBroken, "stuck at "+d.Port+", whose hub cannot switch its power: it needs a visit", true)
			continue
		}
		h.cycles++
		h.last = time.Now()
		if err := hub.PowerCycle(ctx, d.Port); err != nil {
			a.keyEvent(keyID, edgeboxv1.ReasonPowerCycleFailed, err.Error(), true)
		} else {
			why := "stuck"
			if !d.Stuck {
				why = "its workload became unhealthy"
			}
			a.keyEvent(keyID, edgeboxv1.ReasonPowerCycled, fmt.Sprintf("%s at %s; power cycle %d of %d", why, d.Port, h.cycles, maxCycles), true)
		}
		if h.cycles >= maxCycles {
			h.broken = true
			a.keyEvent(keyID, edgeboxv1.ReasonBroken, fmt.Sprintf("still stuck after %d power cycles: it needs a visit", maxCycles), true)
		}
	}
}

// leasedKeys maps the serial (or "port:"+port) of every leased key to its
// key ID.
func (a *Agent) leasedKeys() map[string]string {
	out := map[string]string{}
	objs, err := a.local.Objects(edgeboxv1.KindUsbAssignment)
	if err != nil {
		return out
	}
	for _, o := range objs {
		u := o.GetUsbAssignment()
		if u == nil || u.GetImportFrom() != "" { // another box's key
			continue
		}
		if u.GetSerial() != "" {
			out[u.GetSerial()] = u.GetKeyId()
		} else {
			out["port:"+u.GetPortPath()] = u.GetKeyId()
		}
	}
	return out
}

func (a *Agent) keyEvent(keyID, reason, msg string, warning bool) {
	a.log.Info("USB key", "key", keyID, "reason", reason, "msg", msg)
	a.reports.Event(&edgeboxv1.Event{TimeUnixNano: time.Now().UnixNano(), Kind: edgeboxv1.KindKey, Name: keyID, Reason: reason,
		Message: msg, Warning: warning})
}

// suspectKeys marks keys whose holder became unhealthy: the next healing
// round power-cycles them as if they were stuck.
func (a *Agent) suspectKeys(devs []runtime.Device) {
	a.suspectMu.Lock()
	defer a.suspectMu.Unlock()
	if a.suspect == nil {
		a.suspect = map[string]bool{}
	}
	for _, d := range devs {
		a.suspect[d.KeyID] = true
	}
}

func (a *Agent) takeSuspect(keyID string) bool {
	a.suspectMu.Lock()
	defer a.suspectMu.Unlock()
	s := a.suspect[keyID]
	delete(a.suspect, keyID)
	return s
}
