package usbip

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// urbs is the client's side of one imported device's URBs, which Client
// and Remote share: seqnums, the transfers waiting for their answers,
// and the connection they go over.
type urbs struct {
	devid uint32
	// slots holds a token for each seqnum in pending: at most
	// maxInFlight URBs are unanswered, so that a server keeping a
	// resumable session's last maxInFlight replies has every one its
	// client waits for.
	slots chan struct{}
	done  chan struct{} // closed once the device is gone, err set

	// wmu is held from a seqnum's choice to its write, so that seqnums go
	// out in order, and while a resume chooses what to submit again.
	wmu sync.Mutex

	mu      sync.Mutex        // guards what follows
	conn    net.Conn          // nil between connections (a Remote resuming)
	seq     uint32            // the last seqnum chosen
	pending map[uint32]*call  // by seqnum, until the server answers it or its unlink, or a resume drops it
	unlinks map[uint32]uint32 // unlink seqnum → the URB's
	err     error             // why the device is gone; set once
}

// call is one URB in flight.
type call struct {
	in        bool
	length    int
	submit    []byte      // its CMD_SUBMIT, to send again after a resume
	abandoned bool        // its context ended: it is unlinked, or a resume drops it
	ch        chan result // buffered: sent once, when the call leaves pending
}

type result struct {
	data   []byte
	status int32
	err    error
}

// errLost is a transfer whose answer a server no longer had after a
// resume: it ran, and is not run again. A client keeping to maxInFlight
// does not see it.
var errLost = errors.New("usbip: the answer to the transfer was lost with its connection")

func newURBs(devid uint32) *urbs {
	return &urbs{devid: devid, slots: make(chan struct{}, maxInFlight), done: make(chan struct{}),
		pending: map[uint32]*call{}, unlinks: map[uint32]uint32{}}
}

func (u *urbs) control(ctx context.Context, s usbdev.Setup, data []byte) ([]byte, error) {
	if s.In() {
		return u.submit(ctx, 0, true, s.Bytes(), nil, int(s.Length))
	}
	return u.submit(ctx, 0, false, s.Bytes(), data, len(data))
}

func (u *urbs) transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	if ep&0x80 != 0 {
		return u.submit(ctx, uint32(ep&0x0f), true, [8]byte{}, nil, length)
	}
	return u.submit(ctx, uint32(ep&0x0f), false, [8]byte{}, data, len(data))
}

// submit sends a URB and waits for its end, unlinking it if ctx ends
// first. Between connections it is sent by the resume.
func (u *urbs) submit(ctx context.Context, ep uint32, in bool, setup [8]byte, out []byte, length int) ([]byte, error) {
	if length < 0 || length > MaxTransfer {
		return nil, fmt.Errorf("usbip: a transfer of %d bytes; at most %d", length, MaxTransfer)
	}
	select {
	case u.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-u.done:
		return nil, ErrClosed
	}
	cl := &call{in: in, length: length, ch: make(chan result, 1)}
	dir := uint32(dirOut)
	if in {
		dir = dirIn
	}
	u.wmu.Lock()
	u.mu.Lock()
	if u.err != nil {
		u.mu.Unlock()
		u.wmu.Unlock()
		<-u.slots
		return nil, ErrClosed
	}
	seq := u.next()
	b := binary.BigEndian.AppendUint32(nil, cmdSubmit)
	b = binary.BigEndian.AppendUint32(b, seq)
	b = binary.BigEndian.AppendUint32(b, u.devid)
	b = binary.BigEndian.AppendUint32(b, dir)
	b = binary.BigEndian.AppendUint32(b, ep)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, uint32(length))
	b = append(b, 0, 0, 0, 0)             // start_frame
	b = append(b, 0xff, 0xff, 0xff, 0xff) // number_of_packets: not isochronous
	b = append(b, 0, 0, 0, 0)             // interval
	cl.submit = append(append(b, setup[:]...), out...)
	u.pending[seq] = cl
	conn := u.conn
	u.mu.Unlock()
	if conn != nil {
		u.write(conn, cl.submit) // failing, it closes conn: the reader ends
	}
	u.wmu.Unlock()
	select {
	case r := <-cl.ch:
		return r.out()
	case <-ctx.Done():
	}
	// Unlinked: the server answers the unlink, and the URB's own answer
	// only if it had ended before; the reader keeps the URB until one
	// comes, to read its data off the wire. Between connections it is
	// only marked: the resume drops it, and the server cancels it.
	u.wmu.Lock()
	u.mu.Lock()
	if _, ok := u.pending[seq]; ok {
		cl.abandoned = true
		useq := u.next()
		u.unlinks[useq] = seq
		conn := u.conn
		u.mu.Unlock()
		if conn != nil {
			b := binary.BigEndian.AppendUint32(nil, cmdUnlink)
			b = binary.BigEndian.AppendUint32(b, useq)
			b = binary.BigEndian.AppendUint32(b, u.devid)
			b = append(b, make([]byte, 8)...)
			b = binary.BigEndian.AppendUint32(b, seq)
			u.write(conn, append(b, make([]byte, 24)...))
		}
	} else {
		u.mu.Unlock()
	}
	u.wmu.Unlock()
	select {
	case r := <-cl.ch: // it ended before the unlink
		return r.out()
	default:
	}
	return nil, ctx.Err()
}

// next chooses a seqnum; hold u.mu. It is never 0.
func (u *urbs) next() uint32 {
	u.seq++
	if u.seq == 0 {
		u.seq++
	}
	return u.seq
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

// write sends b on conn; hold u.wmu. Failing, it closes conn, so that
// nothing more goes out after a part of a URB.
func (u *urbs) write(conn net.Conn, b []byte) error {
	conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := conn.Write(b)
	if err != nil {
		conn.Close()
	}
	return err
}

// attach makes conn the connection URBs go over.
func (u *urbs) attach(conn net.Conn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.conn = conn
}

// detach lets conn go: URBs submitted until the next attach wait for it.
func (u *urbs) detach(conn net.Conn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn == conn {
		u.conn = nil
	}
}

// forget takes seq out of pending and returns its call, or nil; hold u.mu.
func (u *urbs) forget(seq uint32) *call {
	cl, ok := u.pending[seq]
	if ok {
		delete(u.pending, seq)
		<-u.slots
	}
	return cl
}

// waiting is, for a resume, the URBs whose answers are still awaited,
// in the order they were sent; those abandoned, and unlinks in flight,
// are dropped (the server cancels what it still runs of them). Hold
// u.wmu, with no reader running.
func (u *urbs) waiting() []uint32 {
	u.mu.Lock()
	defer u.mu.Unlock()
	var w []uint32
	for seq, cl := range u.pending {
		if cl.abandoned {
			u.forget(seq)
			continue
		}
		w = append(w, seq)
	}
	clear(u.unlinks)
	slices.SortFunc(w, func(a, b uint32) int { return int(int32(a - b)) })
	return w
}

// read takes the server's answers from conn until it fails. An error
// wrapping errServer is the server breaking the protocol.
func (u *urbs) read(conn net.Conn) error {
	for {
		var h [urbHeaderSize]byte
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			return err
		}
		command, seq := be32(h[0:]), be32(h[4:])
		switch command {
		case retUnlink:
			u.mu.Lock()
			if target, ok := u.unlinks[seq]; ok {
				delete(u.unlinks, seq)
				u.forget(target)
			}
			u.mu.Unlock()
			continue
		case retSubmit:
		default:
			return fmt.Errorf("usbip: the server sent command %#x: %w", command, errServer)
		}
		status, actual := int32(be32(h[20:])), int64(int32(be32(h[24:])))
		u.mu.Lock()
		cl := u.pending[seq]
		u.mu.Unlock()
		if cl == nil {
			return fmt.Errorf("usbip: an answer to URB %d, which is not in flight: %w", seq, errServer)
		}
		// The call stays pending until its data is read: lost with the
		// connection, a resume asks for it again.
		var data []byte
		if cl.in {
			if actual < 0 || actual > int64(cl.length) {
				return fmt.Errorf("usbip: %d bytes in answer to a read of %d: %w", actual, cl.length, errServer)
			}
			data = make([]byte, actual)
			if _, err := io.ReadFull(conn, data); err != nil {
				return err
			}
		}
		u.mu.Lock()
		if u.pending[seq] == cl {
			u.forget(seq)
			cl.ch <- result{data: data, status: status}
		}
		u.mu.Unlock()
	}
}

// fail ends every transfer still waiting with ErrClosed, and any to come;
// err says why. It is idempotent.
func (u *urbs) fail(err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.err != nil {
		return
	}
	if err == nil {
		err = ErrClosed
	}
	u.err = err
	u.conn = nil
	for seq, cl := range u.pending {
		u.forget(seq)
		cl.ch <- result{err: ErrClosed}
	}
	clear(u.unlinks)
	close(u.done)
}
