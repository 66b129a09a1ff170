//go:build linux || windows

package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// A key on another box reaches a VM through QEMU's usb-redir device
// (ADR 0018): AttachRedir adds a chardev, a unix socket QEMU listens on
// in the VM's directory (<id>.sock), and a usb-redir device on the VM's
// xHCI bus reading it, both named id. The guest sees nothing until the
// usbredir host side (usbhub/usbredir.Serve) dials the socket and offers
// the device; when that client goes, QEMU unplugs the device from the
// guest, and a new client plugs it in again. device_del unplugs it for
// good, and QEMU deletes the chardev (and its socket file) with the
// device.

var _ runtime.RedirAttacher = (*Driver)(nil)

// maxRedirHex bounds the hex after "ukey-" in a usb-redir id: a key id
// is 12 hex digits now (console/keys), a SHA-256 at most.
const maxRedirHex = 64

// maxSocketPath is the longest path a unix socket can have (sun_path
// holds 108 bytes with its NUL).
const maxSocketPath = 107

// redirGone is how long DetachRedir waits for QEMU to let go of a device
// and its chardev. USB unplug is synchronous in QEMU 7.2 (measured: gone
// at device_del's answer); the wait covers a busy QEMU.
const redirGone = 10 * time.Second

// validRedirID accepts the ids usbID makes: "ukey-" and lowercase hex.
func validRedirID(id string) bool {
	h, ok := strings.CutPrefix(id, "ukey-")
	if !ok || h == "" || len(h) > maxRedirHex {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// redirSocket checks name and id and returns the socket of id in VM
// name's directory.
func (d *Driver) redirSocket(name, id string) (string, error) {
	if !edgeboxv1.ValidObjectName(name) {
		return "", errdefs.NotFound("no VM %q", name)
	}
	if !validRedirID(id) {
		return "", errdefs.Invalid("usb-redir id %q: want ukey- and up to %d lowercase hex digits", id, maxRedirHex)
	}
	path := sock(d.vmDir(name), id)
	if len(path) > maxSocketPath {
		return "", errdefs.Invalid("usb-redir socket %s is longer than a unix socket's %d bytes: use a shorter state directory", path, maxSocketPath)
	}
	return path, nil
}

// AttachRedir adds a usb-redir device id, on a chardev socket of the same
// id, to running VM name and returns the socket. What is there already
// stays: the chardev of an attach cut short gets its device, and an id
// attached whole returns its socket. Safe concurrently; a VM not running
// is errdefs.ErrConflict.
func (d *Driver) AttachRedir(name, id string) (string, error) {
	path, err := d.redirSocket(name, id)
	if err != nil {
		return "", err
	}
	d.redirMu.Lock()
	defer d.redirMu.Unlock()
	chardev, device, err := d.redirState(name, id)
	if err != nil {
		return "", err
	}
	added := false
	if !chardev {
		_, err := d.qmpCall(name, "chardev-add", map[string]any{"id": id, "backend": map[string]any{
			"type": "socket", "data": map[string]any{
				"addr":   map[string]any{"type": "unix", "data": map[string]any{"path": path}},
				"server": true, "wait": false}}})
		if err != nil {
			return "", fmt.Errorf("VM %s: usb-redir %s: chardev-add: %w", name, id, err)
		}
		added = true
	}
	if !device {
		_, err := d.qmpCall(name, "device_add", map[string]any{
			"driver": "usb-redir", "id": id, "chardev": id, "bus": "xhci.0"})
		if err != nil {
			if added {
				d.qmpCall(name, "chardev-remove", map[string]any{"id": id})
			}
			return "", fmt.Errorf("VM %s: usb-redir %s: device_add: %w", name, id, err)
		}
	}
	return path, nil
}

// DetachRedir unplugs usb-redir device id from VM name and removes its
// chardev, and waits until QEMU has let go of both. An id not there, or
// a VM not running, is not an error. Safe concurrently.
func (d *Driver) DetachRedir(name, id string) error {
	path, err := d.redirSocket(name, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if d.pid(name) == 0 {
		return nil // a VM not running holds no device
	}
	d.redirMu.Lock()
	defer d.redirMu.Unlock()
	_, device, err := d.redirState(name, id)
	if err != nil {
		return err
	}
	if device {
		if _, err := d.qmpCall(name, "device_del", map[string]any{"id": id}); err != nil {
			if _, still, qerr := d.redirState(name, id); qerr != nil || still {
				return fmt.Errorf("VM %s: usb-redir %s: device_del: %w", name, id, err)
			}
		}
	}
	// QEMU deletes a usb-redir device's chardev with it; one left without
	// its device (an attach cut short) is removed here.
	deadline := time.Now().Add(redirGone)
	for {
		chardev, device, err := d.redirState(name, id)
		if err != nil {
			return err
		}
		if !chardev && !device {
			os.Remove(path) // QEMU removes it; a QEMU killed leaves it
			return nil
		}
		if chardev && !device {
			d.qmpCall(name, "chardev-remove", map[string]any{"id": id})
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("VM %s: usb-redir %s: QEMU still holds it %s after device_del (device %v, chardev %v)", name, id, redirGone, device, chardev)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redirState says whether VM name has a chardev and a device named id.
func (d *Driver) redirState(name, id string) (chardev, device bool, err error) {
	raw, err := d.qmpCall(name, "query-chardev", nil)
	if err != nil {
		return false, false, fmt.Errorf("VM %s: query-chardev: %w", name, err)
	}
	var chardevs []struct {
		Label string `json:"label"`
	}
	if err := json.Unmarshal(raw, &chardevs); err != nil {
		return false, false, fmt.Errorf("VM %s: query-chardev: %w", name, err)
	}
	for _, c := range chardevs {
		chardev = chardev || c.Label == id
	}
	raw, err = d.qmpCall(name, "qom-list", map[string]any{"path": "/machine/peripheral"})
	if err != nil {
		return false, false, fmt.Errorf("VM %s: qom-list: %w", name, err)
	}
	var props []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &props); err != nil {
		return false, false, fmt.Errorf("VM %s: qom-list: %w", name, err)
	}
	for _, p := range props {
		device = device || p.Name == id
	}
	return chardev, device, nil
}

// qmpCall runs one QMP command with args (nil: none) on running VM name
// and returns what it returned.
func (d *Driver) qmpCall(name, cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	out, err := d.QMP(name, raw)
	if err != nil {
		return nil, err
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	return r.Return, nil
}
