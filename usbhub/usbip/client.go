package usbip

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Client is a device imported from a USB/IP server, driven as a
// usbdev.Device: each transfer is a URB, and a transfer whose context
// ends is unlinked. It is how a key served on one box is used on
// another (bridged into a VM with usbredir), with the server's side
// unchanged.
type Client struct {
	conn  net.Conn
	info  usbdev.Info
	devid uint32

	wmu sync.Mutex // writes

	mu      sync.Mutex
	seq     uint32
	pending map[uint32]*call  // by seqnum, until the server answers it or its unlink
	unlinks map[uint32]uint32 // unlink seqnum → the URB's
	err     error             // why the connection ended; set once
	done    chan struct{}     // closed when it has
}

// call is one URB in flight.
type call struct {
	in     bool
	length int
	ch     chan result // buffered: the reader never waits on it
}

type result struct {
	data   []byte
	status int32
	err    error
}

// ErrClosed is what a transfer returns once the client's connection has
// ended.
var ErrClosed = errors.New("usbip: the connection to the device ended")

// Import asks the server at the other end of conn for the device busID
// and returns it, ready for transfers. The client owns conn from then
// on: Close closes it.
func Import(ctx context.Context, conn net.Conn, busID string) (*Client, error) {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	} else {
		conn.SetDeadline(time.Now().Add(opTimeout))
	}
	if _, err := conn.Write(appendFixed(appendOpHeader(nil, opReqImport, 0), busID, busIDSize)); err != nil {
		return nil, err
	}
	h, err := readOpHeader(conn)
	if err != nil {
		return nil, fmt.Errorf("usbip: importing %s: %w", busID, err)
	}
	switch {
	case h.Version != Version || h.Code != opRepImport:
		return nil, fmt.Errorf("usbip: importing %s: the server answered %#x (version %#x)", busID, h.Code, h.Version)
	case h.Status != stOK:
		return nil, fmt.Errorf("usbip: the server does not offer %s, or it is in use (status %d)", busID, h.Status)
	}
	d := make([]byte, deviceSize)
	if _, err := io.ReadFull(conn, d); err != nil {
		return nil, fmt.Errorf("usbip: importing %s: %w", busID, err)
	}
	conn.SetDeadline(time.Time{})
	o := pathSize + busIDSize
	c := &Client{conn: conn, devid: be32(d[o:])<<16 | be32(d[o+4:])&0xffff, pending: map[uint32]*call{}, unlinks: map[uint32]uint32{}, done: make(chan struct{}),
		info: usbdev.Info{Speed: usbdev.Speed(be32(d[o+8:])), Vendor: binary.BigEndian.Uint16(d[o+12:]), Product: binary.BigEndian.Uint16(d[o+14:]),
			BCDDevice: binary.BigEndian.Uint16(d[o+16:]), Class: d[o+18], SubClass: d[o+19], Protocol: d[o+20], Configuration: d[o+21]}}
	go c.read()
	return c, nil
}

// Info says what the device is, as the server did.
func (c *Client) Info() usbdev.Info { return c.info }

// Close ends the connection; transfers in flight return ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Control runs a control transfer.
func (c *Client) Control(ctx context.Context, s usbdev.Setup, data []byte) ([]byte, error) {
	if s.In() {
		return c.submit(ctx, 0, true, s.Bytes(), nil, int(s.Length))
	}
	return c.submit(ctx, 0, false, s.Bytes(), data, len(data))
}

// Transfer runs a bulk or interrupt transfer.
func (c *Client) Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	if ep&0x80 != 0 {
		return c.submit(ctx, uint32(ep&0x0f), true, [8]byte{}, nil, length)
	}
	return c.submit(ctx, uint32(ep&0x0f), false, [8]byte{}, data, len(data))
}

// submit sends a URB and waits for its end, unlinking it if ctx ends
// first.
func (c *Client) submit(ctx context.Context, ep uint32, in bool, setup [8]byte, out []byte, length int) ([]byte, error) {
	if length < 0 || length > MaxTransfer {
		return nil, fmt.Errorf("usbip: a transfer of %d bytes; at most %d", length, MaxTransfer)
	}
	cl := &call{in: in, length: length, ch: make(chan result, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.seq++
	seq := c.seq
	c.pending[seq] = cl
	c.mu.Unlock()
	dir := uint32(dirOut)
	if in {
		dir = dirIn
	}
	b := binary.BigEndian.AppendUint32(nil, cmdSubmit)
	b = binary.BigEndian.AppendUint32(b, seq)
	b = binary.BigEndian.AppendUint32(b, c.devid)
	b = binary.BigEndian.AppendUint32(b, dir)
	b = binary.BigEndian.AppendUint32(b, ep)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, uint32(length))
	b = append(b, 0, 0, 0, 0)             // start_frame
	b = append(b, 0xff, 0xff, 0xff, 0xff) // number_of_packets: not isochronous
	b = append(b, 0, 0, 0, 0)             // interval
	b = append(append(b, setup[:]...), out...)
	if err := c.write(b); err != nil {
		return nil, ErrClosed
	}
	select {
	case r := <-cl.ch:
		return r.out()
	case <-ctx.Done():
	}
	// Unlinked: the server answers the unlink, and the URB's own answer
	// only if it had ended before; the reader keeps the URB until one
	// comes, to read its data off the wire.
	c.mu.Lock()
	c.seq++
	useq := c.seq
	c.unlinks[useq] = seq
	c.mu.Unlock()
	u := binary.BigEndian.AppendUint32(nil, cmdUnlink)
	u = binary.BigEndian.AppendUint32(u, useq)
	u = binary.BigEndian.AppendUint32(u, c.devid)
	u = append(u, make([]byte, 8)...)
	u = binary.BigEndian.AppendUint32(u, seq)
	c.write(append(u, make([]byte, 24)...))
	select {
	case r := <-cl.ch: // it ended before the unlink
		return r.out()
	default:
	}
	return nil, ctx.Err()
}

func (r result) out() ([]byte, error) {
	switch {
	case r.err != nil:
		return nil, r.err
	case r.status == -errnoEPIPE:
		return nil, usbdev.ErrStall
	case r.status != 0:
		return nil, fmt.Errorf("usbip: the transfer failed with status %d", r.status)
	}
	return r.data, nil
}

func (c *Client) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := c.conn.Write(b)
	return err
}

// read takes the server's answers until the connection ends; then every
// transfer still waiting ends with ErrClosed.
func (c *Client) read() {
	err := c.readLoop()
	c.conn.Close()
	c.mu.Lock()
	c.err = err
	for seq, cl := range c.pending {
		cl.ch <- result{err: ErrClosed}
		delete(c.pending, seq)
	}
	c.mu.Unlock()
	close(c.done)
}

func (c *Client) readLoop() error {
	for {
		var h [urbHeaderSize]byte
		if _, err := io.ReadFull(c.conn, h[:]); err != nil {
			return err
		}
		command, seq := be32(h[0:]), be32(h[4:])
		switch command {
		case retUnlink:
			c.mu.Lock()
			delete(c.pending, c.unlinks[seq])
			delete(c.unlinks, seq)
			c.mu.Unlock()
			continue
		case retSubmit:
		default:
			return fmt.Errorf("usbip: the server sent command %#x", command)
		}
		status, actual := int32(be32(h[20:])), int64(int32(be32(h[24:])))
		c.mu.Lock()
		cl, ok := c.pending[seq]
		delete(c.pending, seq)
		c.mu.Unlock()
		if !ok {
			return fmt.Errorf("usbip: an answer to URB %d, which is not in flight", seq)
		}
		var data []byte
		if cl.in {
			if actual < 0 || actual > int64(cl.length) {
				return fmt.Errorf("usbip: %d bytes in answer to a read of %d", actual, cl.length)
			}
			data = make([]byte, actual)
			if _, err := io.ReadFull(c.conn, data); err != nil {
				return err
			}
		}
		cl.ch <- result{data: data, status: status}
	}
}
