package qemu

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
)

// Session attaches to the VM's interactive serial console (its second
// serial port; the first is the log): the guest's getty or shell there
// answers. A serial line takes no command, and one session at a time:
// QEMU serves one client on the port.
func (d *Driver) Session(ctx context.Context, name string, s runtime.SessionSpec) (runtime.SessionProcess, error) {
	if len(s.Command) > 0 {
		return nil, errdefs.Invalid("VM %s: a serial console runs no command; open a shell without one", name)
	}
	_, serial, err := d.Consoles(name)
	if err != nil {
		return nil, err
	}
	if !d.claimSerial(name) {
		return nil, errdefs.Conflict("the serial console of VM %s is in use by another session", name)
	}
	var dialer net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := dialer.DialContext(dctx, "unix", serial)
	if err != nil {
		d.releaseSerial(name)
		return nil, errdefs.Unavailable("the serial console of VM %s: %v", name, err)
	}
	p := &serialSession{conn: conn, done: make(chan struct{}), release: func() { d.releaseSerial(name) }}
	go func() {
		defer close(p.done)
		io.Copy(s.Stdout, conn) // until the VM or the session closes the line
	}()
	go func() {
		io.Copy(conn, s.Stdin) // until the session's input ends
	}()
	// Wake the guest's prompt, which printed before anyone listened.
	conn.Write([]byte("\r"))
	return p, nil
}

// claimSerial takes a VM's serial port for one session.
func (d *Driver) claimSerial(name string) bool {
	d.serialMu.Lock()
	defer d.serialMu.Unlock()
	if d.serialInUse == nil {
		d.serialInUse = map[string]bool{}
	}
	if d.serialInUse[name] {
		return false
	}
	d.serialInUse[name] = true
	return true
}

func (d *Driver) releaseSerial(name string) {
	d.serialMu.Lock()
	defer d.serialMu.Unlock()
	delete(d.serialInUse, name)
}

// serialSession is a session on a VM's serial line.
type serialSession struct {
	conn    net.Conn
	done    chan struct{}
	once    sync.Once
	release func()
}

// Resize: a serial line has no size; the guest's stty sets it.
func (p *serialSession) Resize(cols, rows uint16) error { return nil }

// Signal types the control character a terminal would: a serial line
// carries no signals.
func (p *serialSession) Signal(name string) error {
	switch name {
	case "INT":
		_, err := p.conn.Write([]byte{0x03})
		return err
	case "QUIT":
		_, err := p.conn.Write([]byte{0x1c})
		return err
	}
	return errors.New("a serial console takes INT or QUIT (typed as ^C and ^\\); end the session to leave it")
}

// Wait returns when the line closes: the VM stopped, or Close.
func (p *serialSession) Wait() (int, string, error) {
	<-p.done
	p.once.Do(func() { p.conn.Close(); p.release() })
	return 0, "", nil
}

func (p *serialSession) Close() error {
	p.conn.Close()
	p.Wait()
	return nil
}
