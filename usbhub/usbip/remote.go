package usbip

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// Dialer opens a new connection to the server: between boxes, a new
// tunnel stream.
type Dialer func(ctx context.Context) (net.Conn, error)

// Back-off between dials while a Remote resumes: the first one again at
// once would meet the same broken path.
const (
	minRedial = 100 * time.Millisecond
	maxRedial = time.Second
)

// Remote is a device imported resumably from an edgebox USB/IP server
// (OP_REQ_IMPORT_RESUMABLE, wire.go), driven as a usbdev.Device as
// Client is, and kept across lost connections: it dials again and
// resumes the session, the URBs in flight answered once each and none
// run twice; transfers meanwhile wait. Once its window passes without a
// resume, or the server refuses one, the device is gone: transfers
// return ErrClosed, Done is closed and Err says why. It is safe for
// concurrent use.
type Remote struct {
	dial   Dialer
	busID  string
	window time.Duration
	log    *slog.Logger
	id     sessionID
	info   usbdev.Info
	u      *urbs

	// ctx ends with Close; the Remote owns it, and it bounds every dial
	// and resume.
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
	stopped   chan struct{} // closed once run, which owns the connection, has returned
}

// ImportResumable imports busID through dial, and keeps it across lost
// connections: it dials again and resumes within window; transfers
// meanwhile wait. Once window passes without a resume, or the server
// refuses it, the device is gone: transfers return ErrClosed and Done
// is closed. A dial that fails, or a server refusing the import (the
// device not offered, or in use), is an error at once; a connection lost
// during the import is tried again, within ctx, for a window, since the
// server may hold the device for a session whose answer was lost.
func ImportResumable(ctx context.Context, dial Dialer, busID string, window time.Duration, log *slog.Logger) (*Remote, error) {
	switch {
	case dial == nil:
		return nil, errors.New("usbip: a resumable import needs a dialer")
	case busID == "" || len(busID) >= busIDSize:
		return nil, fmt.Errorf("usbip: bus ID %q: 1 to %d characters", busID, busIDSize-1)
	case window <= 0:
		return nil, fmt.Errorf("usbip: a resume window of %v", window)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Remote{dial: dial, busID: busID, window: window, log: log.With("component", "usbip", "busid", busID), stopped: make(chan struct{})}
	rand.Read(r.id[:])
	conn, devid, info, err := r.first(ctx)
	if err != nil {
		return nil, err
	}
	r.info, r.u = info, newURBs(devid)
	r.u.attach(conn)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	go r.run(conn)
	return r, nil
}

// first makes the import. A connection lost during it is tried again
// for a window, as a resume: the server may have taken the device
// without its answer arriving.
func (r *Remote) first(ctx context.Context) (net.Conn, uint32, usbdev.Info, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var giveUp *time.Timer
	defer func() {
		if giveUp != nil {
			giveUp.Stop()
		}
	}()
	resume := false // the server may hold the session from an attempt whose answer was lost
	wait := minRedial
	for {
		conn, err := r.dial(ctx)
		if err != nil && !resume && giveUp == nil {
			return nil, 0, usbdev.Info{}, fmt.Errorf("usbip: importing %s: %w", r.busID, err) // nothing reached the server
		}
		if err == nil {
			req, code := appendFixed(appendOpHeader(nil, opReqImportResumable, 0), r.busID, busIDSize), uint16(opRepImportResumable)
			req = append(req, r.id[:]...)
			if resume {
				req, code = appendResumeRequest(nil, r.id, nil), opRepResume
			}
			var devid uint32
			var info usbdev.Info
			devid, info, err = handshake(ctx, conn, req, code, r.busID)
			if err == nil && resume {
				_, err = readResumeStates(conn, nil)
			}
			if err == nil {
				conn.SetDeadline(time.Time{})
				return conn, devid, info, nil
			}
			conn.Close()
			switch {
			case resume && errors.Is(err, errRefused):
				resume = false // no session held: import again, at once
				continue
			case errors.Is(err, errRefused), errors.Is(err, errServer):
				return nil, 0, usbdev.Info{}, err
			}
			resume = true
		}
		if giveUp == nil {
			giveUp = time.AfterFunc(r.window, cancel)
		}
		r.log.Debug("a resumable import failed; trying again", "err", err, "in", wait)
		if !pause(ctx, wait) {
			return nil, 0, usbdev.Info{}, fmt.Errorf("usbip: importing %s: %w", r.busID, err)
		}
		wait = min(2*wait, maxRedial)
	}
}

// pause waits d, or less when ctx ends: then it reports false.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// run reads the server's answers, resuming the session over a new
// connection each time one is lost, until the device is gone.
func (r *Remote) run(conn net.Conn) {
	defer close(r.stopped)
	for {
		err := r.u.read(conn)
		conn.Close()
		r.u.detach(conn)
		switch {
		case r.ctx.Err() != nil:
			r.u.fail(ErrClosed)
			return
		case errors.Is(err, errServer):
			r.log.Warn("a remote USB device's server broke the protocol; the device is gone", "err", err)
			r.u.fail(err)
			return
		}
		r.log.Info("the connection to a remote USB device dropped; resuming", "err", err, "window", r.window)
		conn, err = r.resume()
		if err != nil {
			r.log.Warn("a remote USB device could not be resumed; it is gone", "err", err)
			r.u.fail(err)
			return
		}
		if r.ctx.Err() != nil { // closed as it resumed
			r.release()
			r.u.fail(ErrClosed)
			return
		}
		r.log.Info("a remote USB device resumed")
	}
}

// resume dials until a resume of the session succeeds, the server
// refuses it, or the window passes.
func (r *Remote) resume() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.window)
	defer cancel()
	wait := minRedial
	for {
		conn, err := r.dial(ctx)
		if err == nil {
			if err = r.resumeOn(ctx, conn); err == nil {
				return conn, nil
			}
			conn.Close()
			if errors.Is(err, errRefused) || errors.Is(err, errServer) {
				return nil, err
			}
		}
		if r.ctx.Err() != nil {
			return nil, ErrClosed
		}
		r.log.Debug("a resume failed; trying again", "err", err, "in", wait)
		if !pause(ctx, wait) {
			if r.ctx.Err() != nil {
				return nil, ErrClosed
			}
			return nil, fmt.Errorf("usbip: no resume of %s within %v: %w", r.busID, r.window, err)
		}
		wait = min(2*wait, maxRedial)
	}
}

// resumeOn resumes the session over conn: it names the URBs still
// awaited, fails those the server lost, submits again those it never
// read, and makes conn the connection URBs go over.
func (r *Remote) resumeOn(ctx context.Context, conn net.Conn) error {
	u := r.u
	u.wmu.Lock()
	defer u.wmu.Unlock()
	waiting := u.waiting()
	devid, _, err := handshake(ctx, conn, appendResumeRequest(nil, r.id, waiting), opRepResume, r.busID)
	if err != nil {
		return err
	}
	if devid != u.devid {
		return fmt.Errorf("usbip: %s resumed as device %#x, not %#x: %w", r.busID, devid, u.devid, errServer)
	}
	states, err := readResumeStates(conn, waiting)
	if err != nil {
		return err
	}
	for i, seq := range waiting {
		u.mu.Lock()
		cl := u.pending[seq]
		if states[i] == resumeLost && cl != nil {
			u.forget(seq)
			cl.ch <- result{err: errLost}
		}
		u.mu.Unlock()
		if states[i] == resumeResubmit && cl != nil {
			if err := u.write(conn, cl.submit); err != nil {
				return err
			}
		}
	}
	conn.SetDeadline(time.Time{})
	u.attach(conn)
	return nil
}

// Info says what the device is, as the server did.
func (r *Remote) Info() usbdev.Info { return r.info }

// Control runs a control transfer.
func (r *Remote) Control(ctx context.Context, s usbdev.Setup, data []byte) ([]byte, error) {
	return r.u.control(ctx, s, data)
}

// Transfer runs a bulk or interrupt transfer.
func (r *Remote) Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	return r.u.transfer(ctx, ep, data, length)
}

// Done is closed once the device is gone.
func (r *Remote) Done() <-chan struct{} { return r.u.done }

// Err says why the device is gone (ErrClosed after Close); nil until it
// is.
func (r *Remote) Err() error {
	r.u.mu.Lock()
	defer r.u.mu.Unlock()
	return r.u.err
}

// Close lets the device go: transfers in flight return ErrClosed, and
// the server frees the device at once (rather than hold it for a
// resume), or, when Close comes between connections, once its window
// passes. It is idempotent, and waits.
func (r *Remote) Close() error {
	r.closeOnce.Do(func() {
		r.cancel()
		r.release()
	})
	<-r.stopped
	return nil
}

// release tells the server, on the connection URBs go over if any, that
// the session ends, and closes that connection.
func (r *Remote) release() {
	r.u.mu.Lock()
	conn := r.u.conn
	r.u.mu.Unlock()
	if conn == nil {
		return
	}
	conn.SetWriteDeadline(time.Now().Add(time.Second)) // a writer stuck on a dead connection lets go
	r.u.wmu.Lock()
	defer r.u.wmu.Unlock()
	r.u.mu.Lock()
	conn = r.u.conn
	r.u.mu.Unlock()
	if conn == nil {
		return
	}
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	b := binary.BigEndian.AppendUint32(nil, cmdRelease)
	conn.Write(append(b, make([]byte, urbHeaderSize-4)...))
	conn.Close()
}
