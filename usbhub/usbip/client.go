package usbip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Client is a device imported from a USB/IP server, driven as a
// usbdev.Device: each transfer is a URB, and a transfer whose context
// ends is unlinked. It is how a key served on one box is used on
// another (bridged into a VM with usbredir), with the server's side
// unchanged. Remote (remote.go) is the same, kept across lost
// connections.
type Client struct {
	conn net.Conn
	info usbdev.Info
	u    *urbs
}

var (
	_ usbdev.Device = (*Client)(nil)
	_ usbdev.Device = (*Remote)(nil)
)

// ErrClosed is what a transfer returns once the client's connection has
// ended (for a Remote: once it could not resume).
var ErrClosed = errors.New("usbip: the connection to the device ended")

// errServer marks a server sending what the protocol does not allow.
var errServer = errors.New("usbip: the server broke the protocol")

// Import asks the server at the other end of conn for the device busID
// and returns it, ready for transfers. The client owns conn from then
// on: Close closes it.
func Import(ctx context.Context, conn net.Conn, busID string) (*Client, error) {
	devid, info, err := handshake(ctx, conn, appendFixed(appendOpHeader(nil, opReqImport, 0), busID, busIDSize), opRepImport, busID)
	if err != nil {
		return nil, err
	}
	c := &Client{conn: conn, info: info, u: newURBs(devid)}
	conn.SetDeadline(time.Time{})
	c.u.attach(conn)
	go c.read()
	return c, nil
}

// handshake sends an import's (or a resume's) request and reads its
// reply up to the device: its ID and what it is. A refusal is an error
// wrapping errRefused; conn's deadline is left set.
func handshake(ctx context.Context, conn net.Conn, req []byte, code uint16, busID string) (uint32, usbdev.Info, error) {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	} else {
		conn.SetDeadline(time.Now().Add(opTimeout))
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write(req); err != nil {
		return 0, usbdev.Info{}, fmt.Errorf("usbip: importing %s: %w", busID, err)
	}
	h, err := readOpHeader(conn)
	if err != nil {
		return 0, usbdev.Info{}, fmt.Errorf("usbip: importing %s: %w", busID, err)
	}
	switch {
	case h.Version != Version || h.Code != code:
		return 0, usbdev.Info{}, fmt.Errorf("usbip: importing %s: the server answered %#x (version %#x): %w", busID, h.Code, h.Version, errServer)
	case h.Status == stNoSession && code == opRepResume:
		return 0, usbdev.Info{}, fmt.Errorf("usbip: the server no longer holds the session of %s: %w", busID, errRefused)
	case h.Status != stOK:
		return 0, usbdev.Info{}, fmt.Errorf("usbip: the server does not offer %s, or it is in use (status %d): %w", busID, h.Status, errRefused)
	}
	d := make([]byte, deviceSize)
	if _, err := io.ReadFull(conn, d); err != nil {
		return 0, usbdev.Info{}, fmt.Errorf("usbip: importing %s: %w", busID, err)
	}
	got, devid, info := parseDevice(d)
	if got != busID {
		return 0, usbdev.Info{}, fmt.Errorf("usbip: importing %s, the server gave %q: %w", busID, got, errServer)
	}
	return devid, info, nil
}

// errRefused marks a server refusing an import or a resume.
var errRefused = errors.New("refused")

// Dial imports busID from the USB/IP server at addr (TCP), within ctx, or
// 10 s when ctx has no deadline.
func Dial(ctx context.Context, addr, busID string) (*Client, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opTimeout)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c, err := Import(ctx, conn, busID)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// Info says what the device is, as the server did.
func (c *Client) Info() usbdev.Info { return c.info }

// Close ends the connection; transfers in flight return ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.u.done
	return err
}

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.u.done }

// Control runs a control transfer.
func (c *Client) Control(ctx context.Context, s usbdev.Setup, data []byte) ([]byte, error) {
	return c.u.control(ctx, s, data)
}

// Transfer runs a bulk or interrupt transfer.
func (c *Client) Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	return c.u.transfer(ctx, ep, data, length)
}

// read takes the server's answers until the connection ends; then every
// transfer still waiting ends with ErrClosed.
func (c *Client) read() {
	err := c.u.read(c.conn)
	c.conn.Close()
	c.u.fail(err)
}
