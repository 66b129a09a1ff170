//go:build linux

// Package usbfs drives the simulated key's CCID card (usbhub/ccid)
// through Linux's usbfs, as the static programs of the test guests do:
// claim the reader's interface, power the card, select its application,
// and have it sign. It uses nothing but system calls, so a guest needs
// no libusb.
package usbfs

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

const (
	claimInterface = 0x8004550F // USBDEVFS_CLAIMINTERFACE
	bulkTransfer   = 0xC0185502 // USBDEVFS_BULK
	timeoutMillis  = 30000
)

// bulk is struct usbdevfs_bulktransfer.
type bulk struct {
	ep, length, timeout, _ uint32
	data                   uintptr
}

// Card is the card of a key opened through its usbfs node.
type Card struct {
	f   *os.File
	seq byte
}

// Open claims the reader at node (/dev/bus/usb/BUS/DEV), powers its card
// and selects its application.
func Open(node string) (*Card, error) {
	f, err := os.OpenFile(node, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	c := &Card{f: f}
	iface := uint32(0)
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), claimInterface, uintptr(unsafe.Pointer(&iface))); e != 0 {
		f.Close()
		return nil, fmt.Errorf("claiming the interface: %v", e)
	}
	if _, err := c.command(0x62, nil); err != nil { // PC_to_RDR_IccPowerOn
		f.Close()
		return nil, fmt.Errorf("power on: %w", err)
	}
	aid := []byte{0xF0, 'E', 'D', 'G', 'E', 'B', 'O', 'X'}
	if r, err := c.command(0x6F, append([]byte{0, 0xA4, 4, 0, byte(len(aid))}, aid...)); err != nil || len(r) != 2 || r[0] != 0x90 {
		f.Close()
		return nil, fmt.Errorf("SELECT: %x %v", r, err)
	}
	return c, nil
}

// Sign has the card sign msg (at most 255 bytes) and returns the
// signature.
func (c *Card) Sign(msg string) ([]byte, error) {
	r, err := c.command(0x6F, append(append([]byte{0, 0x2A, 0x9E, 0x9A, byte(len(msg))}, msg...), 0))
	if err != nil || len(r) < 2 || r[len(r)-2] != 0x90 {
		return nil, fmt.Errorf("sign: %x %v", r, err)
	}
	return r[:len(r)-2], nil
}

// Close lets the reader go.
func (c *Card) Close() error { return c.f.Close() }

// command sends one reader command of type typ on bulk OUT and returns
// the data of its answer from bulk IN.
func (c *Card) command(typ byte, body []byte) ([]byte, error) {
	c.seq++
	m := []byte{typ}
	m = binary.LittleEndian.AppendUint32(m, uint32(len(body)))
	m = append(append(m, 0, c.seq, 0, 0, 0), body...)
	if _, err := c.xfer(0x01, m); err != nil {
		return nil, err
	}
	in := make([]byte, 1024)
	n, err := c.xfer(0x82, in)
	if err != nil {
		return nil, err
	}
	if n < 10 || in[7] != 0 {
		return nil, fmt.Errorf("the reader answered %x", in[:n])
	}
	return in[10:n], nil
}

func (c *Card) xfer(ep uint32, buf []byte) (int, error) {
	b := bulk{ep: ep, length: uint32(len(buf)), timeout: timeoutMillis, data: uintptr(unsafe.Pointer(&buf[0]))}
	n, _, e := syscall.Syscall(syscall.SYS_IOCTL, c.f.Fd(), bulkTransfer, uintptr(unsafe.Pointer(&b)))
	runtime.KeepAlive(buf)
	if e != 0 {
		return 0, fmt.Errorf("bulk on %#x: %v", ep, e)
	}
	return int(n), nil
}
