// Command apdu runs in a test guest: through usbfs (the node in its
// first argument) it powers the simulated key's card, selects its
// application and has it sign a message, then prints the signature
// ("APDU SIGNED <hex>"). Built static for the guest by the test.
//
// With a second argument, a period such as 1s (or that period in
// APDU_EVERY, which a guest's kernel command line sets), it goes on
// signing each period, printing "APDU <n> SIGNED <hex>", until the key
// fails it.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

const (
	claimInterface = 0x8004550F // USBDEVFS_CLAIMINTERFACE
	bulkTransfer   = 0xC0185502 // USBDEVFS_BULK
)

// Message is what the card signs.
const Message = "statement 2026-11, signed in the guest"

type bulk struct {
	ep, length, timeout, _ uint32
	data                   uintptr
}

func main() {
	period := os.Getenv("APDU_EVERY")
	if len(os.Args) > 2 {
		period = os.Args[2]
	}
	every, _ := time.ParseDuration(period)
	if err := run(os.Args[1], every); err != nil {
		fmt.Println("APDU FAILED", err)
		os.Exit(1)
	}
}

func run(node string, every time.Duration) error {
	f, err := os.OpenFile(node, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	iface := uint32(0)
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), claimInterface, uintptr(unsafe.Pointer(&iface))); e != 0 {
		return fmt.Errorf("claiming the interface: %v", e)
	}
	xfer := func(ep uint32, buf []byte) (int, error) {
		b := bulk{ep: ep, length: uint32(len(buf)), timeout: 30000, data: uintptr(unsafe.Pointer(&buf[0]))}
		n, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), bulkTransfer, uintptr(unsafe.Pointer(&b)))
		runtime.KeepAlive(buf)
		if e != 0 {
			return 0, fmt.Errorf("bulk on %#x: %v", ep, e)
		}
		return int(n), nil
	}
	seq := byte(0)
	command := func(typ byte, body []byte) ([]byte, error) {
		seq++
		m := []byte{typ}
		m = binary.LittleEndian.AppendUint32(m, uint32(len(body)))
		m = append(append(m, 0, seq, 0, 0, 0), body...)
		if _, err := xfer(0x01, m); err != nil {
			return nil, err
		}
		in := make([]byte, 1024)
		n, err := xfer(0x82, in)
		if err != nil {
			return nil, err
		}
		if n < 10 || in[7] != 0 {
			return nil, fmt.Errorf("the reader answered %x", in[:n])
		}
		return in[10:n], nil
	}
	if _, err := command(0x62, nil); err != nil {
		return fmt.Errorf("power on: %w", err)
	}
	aid := []byte{0xF0, 'E', 'D', 'G', 'E', 'B', 'O', 'X'}
	if r, err := command(0x6F, append([]byte{0, 0xA4, 4, 0, byte(len(aid))}, aid...)); err != nil || len(r) != 2 || r[0] != 0x90 {
		return fmt.Errorf("SELECT: %x %v", r, err)
	}
	for n := 1; ; n++ {
		r, err := command(0x6F, append(append([]byte{0, 0x2A, 0x9E, 0x9A, byte(len(Message))}, Message...), 0))
		if err != nil || len(r) < 2 || r[len(r)-2] != 0x90 {
			return fmt.Errorf("sign: %x %v", r, err)
		}
		if every <= 0 {
			fmt.Printf("APDU SIGNED %x\n", r[:len(r)-2])
			return nil
		}
		fmt.Printf("APDU %d SIGNED %x\n", n, r[:len(r)-2])
		time.Sleep(every)
	}
}
