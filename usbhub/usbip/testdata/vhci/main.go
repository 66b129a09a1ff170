// Command vhci runs in a test guest (vmtest.USBIPFiles) with the kernel's
// vhci-hcd: it dials the USB/IP server at USBIP_SERVER, attaches the
// device USBIP_BUSID with usbip.AttachVHCI (the agent's own code), waits
// for it on the vhci bus and prints it ("VHCI DEVICE VID:PID SERIAL
// NODE"), has its card sign through usbfs ("APDU SIGNED <hex>"), then
// detaches it with usbip.DetachVHCI, waits for it to go ("VHCI
// DETACHED"), and imports it again as a plain client, which the server
// allows once the kernel's connection has ended ("VHCI OFFERED AGAIN").
// Around that it checks the kernel's refusals: a device the
// server does not offer takes no port, and a second detach is refused
// ("VHCI REFUSED ..."). Any failure prints "VHCI FAILED" and exits 1.
// Built static for the guest by the test.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/test/ccidtest/usbfs"
	"github.com/edgebox/edgebox/usbhub/usbip"
)

// Message is what the card signs.
const Message = "statement 2026-11, signed in the guest over vhci-hcd"

func main() {
	if err := run(os.Getenv("USBIP_SERVER"), os.Getenv("USBIP_BUSID")); err != nil {
		fmt.Println("VHCI FAILED", err)
		os.Exit(1)
	}
}

func run(server, busID string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func() (net.Conn, error) {
		var d net.Dialer
		for {
			c, err := d.DialContext(ctx, "tcp", server)
			if err == nil || ctx.Err() != nil {
				return c, err
			}
			time.Sleep(200 * time.Millisecond) // the NIC's link comes up
		}
	}

	// A device the server does not offer takes no port.
	conn, err := dial()
	if err != nil {
		return err
	}
	if port, err := usbip.AttachVHCI(ctx, conn, "9-9"); err == nil {
		return fmt.Errorf("attached 9-9, which the server does not offer, on port %d", port)
	} else if !errors.Is(err, errdefs.ErrUnavailable) {
		return fmt.Errorf("attaching 9-9: %w", err)
	} else {
		fmt.Println("VHCI REFUSED 9-9:", err)
	}

	conn, err = dial()
	if err != nil {
		return err
	}
	start := time.Now()
	port, err := usbip.AttachVHCI(ctx, conn, busID)
	if err != nil {
		return err
	}
	fmt.Println("VHCI ATTACHED port", port)
	p, err := waitPort(ctx, port, func(p usbip.VHCIPort) bool { return p.BusID != "" })
	if err != nil {
		return err
	}
	dev := filepath.Join("/sys/bus/usb/devices", p.BusID)
	for {
		if _, err := os.Stat(filepath.Join(dev, "serial")); err == nil {
			break
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("%s never had a serial: %w", dev, err)
		}
	}
	attr := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dev, name))
		return strings.TrimSpace(string(b))
	}
	bus, err1 := strconv.Atoi(attr("busnum"))
	devnum, err2 := strconv.Atoi(attr("devnum"))
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("%s: %w", dev, err)
	}
	node := fmt.Sprintf("/dev/bus/usb/%03d/%03d", bus, devnum)
	for {
		if _, err := os.Stat(node); err == nil {
			break
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("%s never came: %w", node, err)
		}
	}
	fmt.Printf("VHCI DEVICE %s:%s %s %s on %s speed %d in %v\n", attr("idVendor"), attr("idProduct"), attr("serial"), node,
		p.BusID, p.Speed, time.Since(start).Round(time.Millisecond))

	sig, err := sign(node)
	if err != nil {
		return err
	}
	fmt.Printf("APDU SIGNED %x\n", sig)

	if err := usbip.DetachVHCI(port); err != nil {
		return err
	}
	if _, err := waitPort(ctx, port, func(p usbip.VHCIPort) bool { return p.Free }); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(dev); errors.Is(err, os.ErrNotExist) {
			break
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("%s stayed after the detach: %w", dev, err)
		}
	}
	fmt.Println("VHCI DETACHED port", port)
	// The detach ended the kernel's connection: the server offers the
	// device again (once it has seen the connection go).
	for {
		conn, err := dial()
		if err != nil {
			return err
		}
		c, err := usbip.Import(ctx, conn, busID)
		if err == nil {
			c.Close()
			break
		}
		conn.Close()
		if err := pause(ctx); err != nil {
			return fmt.Errorf("the server did not offer %s again after the detach: %w", busID, err)
		}
	}
	fmt.Println("VHCI OFFERED AGAIN", busID)
	if err := usbip.DetachVHCI(port); !errors.Is(err, errdefs.ErrInvalid) {
		return fmt.Errorf("detaching port %d again: %v; want it refused as invalid", port, err)
	} else {
		fmt.Println("VHCI REFUSED a second detach:", err)
	}
	return nil
}

// waitPort polls vhci-hcd's status until port is as ok says.
func waitPort(ctx context.Context, port int, ok func(usbip.VHCIPort) bool) (usbip.VHCIPort, error) {
	for {
		p, err := usbip.VHCI{}.Port(port)
		if err != nil {
			return p, err
		}
		if ok(p) {
			return p, nil
		}
		if err := pause(ctx); err != nil {
			return p, fmt.Errorf("vhci port %d stayed %+v: %w", port, p, err)
		}
	}
}

func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(50 * time.Millisecond):
		return nil
	}
}

// sign has the card of the key at node sign Message.
func sign(node string) ([]byte, error) {
	card, err := usbfs.Open(node)
	if err != nil {
		return nil, err
	}
	defer card.Close()
	return card.Sign(Message)
}
