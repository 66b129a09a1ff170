package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
	"github.com/edgebox/edgebox/usbhub"
	"github.com/edgebox/edgebox/usbhub/usbdev"
	"github.com/edgebox/edgebox/usbhub/usbip"
	"github.com/edgebox/edgebox/usbhub/usbredir"
)

// Remote UKEYs: a key on this box used by a workload of another box
// (exported), and a key of another box used by a workload here
// (imported). Both travel on the tunnel's usbip streams, which the
// console joins while the lease lasts (ADR 0018).
const (
	// keyResumeWindow is how long a key's USB/IP session outlives its
	// stream: a blip shorter than this is not an unplug.
	keyResumeWindow = 10 * time.Second
	// keyFollowEvery is how often the assignments are looked at for keys
	// to export no more; keyImportEvery for keys to import, which is also
	// done at once whenever the desired state changes (kickKeys): an idle
	// box stays cheap.
	keyFollowEvery = 500 * time.Millisecond
	keyImportEvery = 30 * time.Second
	// maxKeyStreams bounds the usbip streams served at once: a hub's
	// worth of keys, each used from another box.
	maxKeyStreams = 128
	// keyOpenTimeout bounds opening a key's stream and hearing the answer.
	keyOpenTimeout = 15 * time.Second
)

// keyExports are the keys of this box served to other boxes: one USB/IP
// server, so that a session resumed on a new stream finds the one it
// had.
type keyExports struct {
	srv *usbip.Server
	mu  sync.Mutex
	ids map[string]exported // by key ID
	// offered is the number of keys in ids, for the tunnel to hurry
	// back while there is one (Agent.keysOffered).
	offered *atomic.Int32
}

// exported is a key offered to other boxes: where it was opened, and the
// device, closed when it is offered no more (a physical key then goes
// back to the kernel's driver).
type exported struct {
	port string
	dev  usbdev.Device
}

// remove stops offering key id and lets go of its device; hold ex.mu.
func (ex *keyExports) remove(id string) {
	e, ok := ex.ids[id]
	if !ok {
		return
	}
	ex.srv.Remove(id)
	delete(ex.ids, id)
	ex.offered.Store(int32(len(ex.ids)))
	if c, ok := e.dev.(io.Closer); ok {
		c.Close()
	}
}

// serveKeyExports answers the console's usbip streams until ctx ends: a
// stream names a key, which this box serves only while an assignment
// exports it and it is plugged in. Keys whose assignment went, or which
// were unplugged, stop being offered, and their sessions end.
func (a *Agent) serveKeyExports(ctx context.Context, ln net.Listener) {
	ex := &keyExports{srv: usbip.New(a.log), ids: map[string]exported{}, offered: &a.keysOffered}
	ex.srv.ResumeWindow = keyResumeWindow
	defer func() {
		ex.mu.Lock()
		for id := range ex.ids {
			ex.remove(id)
		}
		ex.mu.Unlock()
		ex.srv.Close()
	}()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.sweepKeyExports(ctx, ex)
	}()
	sem := make(chan struct{}, maxKeyStreams)
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			forwarding.WriteReply(c, fmt.Errorf("the box serves %d key streams already", maxKeyStreams))
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			a.exportKey(ctx, ex, c)
		}()
	}
}

// exportKey serves one stream of the console's, for the key it names.
func (a *Agent) exportKey(ctx context.Context, ex *keyExports, c net.Conn) {
	defer c.Close()
	var id string
	if tc, ok := c.(*tunnel.Conn); ok {
		id = tc.Header().Meta[forwarding.MetaKey]
	}
	if err := a.offerKey(ctx, ex, id); err != nil {
		a.log.Info("a key asked for by another box was not served", "key", id, "err", err)
		forwarding.WriteReply(c, err)
		return
	}
	if err := forwarding.WriteReply(c, nil); err != nil {
		return
	}
	ex.srv.ServeConn(ctx, c)
}

// offerKey offers key id on the export server, if an assignment exports
// it and it is plugged in here.
func (a *Agent) offerKey(ctx context.Context, ex *keyExports, id string) error {
	var u *edgeboxv1.UsbAssignment
	for _, x := range a.assignmentsOf("") {
		if x.GetKeyId() == id && x.GetExportTo() != "" {
			u = x
		}
	}
	if u == nil {
		return fmt.Errorf("key %q is not leased to a workload of another box", id)
	}
	opener, ok := a.cfg.USB.(usbhub.Opener)
	if !ok {
		return fmt.Errorf("this box cannot serve its keys to other boxes: its agent was built without libusb (-tags gousb)")
	}
	devs, err := a.cfg.USB.Devices(ctx)
	if err != nil {
		return fmt.Errorf("reading the box's USB keys: %w", err)
	}
	d, ok := leasedDevice(u, devs)
	if !ok {
		return fmt.Errorf("key %s is not plugged in on this box", id)
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if e, ok := ex.ids[id]; ok && e.port == d.Port {
		return nil
	}
	ex.remove(id) // it moved to another port
	dev, err := opener.Open(ctx, d.Port)
	if err != nil {
		return fmt.Errorf("opening key %s: %w", id, err)
	}
	if err := ex.srv.Add(id, dev); err != nil {
		if c, ok := dev.(io.Closer); ok {
			c.Close()
		}
		return err
	}
	ex.ids[id] = exported{port: d.Port, dev: dev}
	ex.offered.Store(int32(len(ex.ids)))
	return nil
}

// sweepKeyExports stops offering keys whose assignment went, or which
// are no longer plugged in where they were opened.
func (a *Agent) sweepKeyExports(ctx context.Context, ex *keyExports) {
	t := time.NewTicker(keyFollowEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ex.mu.Lock()
		n := len(ex.ids)
		ex.mu.Unlock()
		if n == 0 {
			continue
		}
		leased := map[string]*edgeboxv1.UsbAssignment{}
		for _, u := range a.assignmentsOf("") {
			if u.GetExportTo() != "" {
				leased[u.GetKeyId()] = u
			}
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		devs, err := a.cfg.USB.Devices(dctx)
		cancel()
		if err != nil {
			continue
		}
		ex.mu.Lock()
		for id, e := range ex.ids {
			u, ok := leased[id]
			var d usbhub.Device
			if ok {
				d, ok = leasedDevice(u, devs)
			}
			if !ok || d.Port != e.port {
				a.log.Info("a key is no longer served to another box", "key", id, "leased", leased[id] != nil)
				ex.remove(id)
			}
		}
		ex.mu.Unlock()
	}
}

// importKeys follows the assignments of keys this box's workloads hold
// on other boxes: each one gets a link (linkKey) while it lasts.
func (a *Agent) importKeys(ctx context.Context) {
	type link struct {
		u      *edgeboxv1.UsbAssignment
		cancel context.CancelFunc
		done   chan struct{}
	}
	links := map[string]*link{}
	lk := &localKeys{a: a}
	defer func() {
		for _, l := range links {
			l.cancel()
			<-l.done
		}
		lk.close()
	}()
	t := time.NewTicker(keyImportEvery)
	defer t.Stop()
	for {
		want := map[string]*edgeboxv1.UsbAssignment{}
		for _, u := range a.assignmentsOf("") {
			if u.GetImportFrom() != "" {
				want[u.GetKeyId()] = u
			}
		}
		for id, l := range links {
			if u, ok := want[id]; !ok || u.GetWorkload() != l.u.GetWorkload() || u.GetImportFrom() != l.u.GetImportFrom() {
				l.cancel()
				<-l.done
				delete(links, id)
			}
		}
		for id, u := range want {
			if _, ok := links[id]; ok {
				continue
			}
			lctx, cancel := context.WithCancel(ctx)
			l := &link{u: u, cancel: cancel, done: make(chan struct{})}
			links[id] = l
			go func() {
				defer close(l.done)
				a.linkKey(lctx, lk, u)
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.keysKick:
		}
	}
}

// kickKeys has importKeys look at the assignments now.
func (a *Agent) kickKeys() {
	select {
	case a.keysKick <- struct{}{}:
	default:
	}
}

// redirID names a key's usb-redir device in its VM.
func redirID(keyID string) string { return "ukey-" + strings.TrimPrefix(keyID, "k-") }

// linkKey keeps key u, which sits on another box, plugged into its VM
// workload here until ctx ends (the assignment went): imported through
// the console, resumed across blips of up to keyResumeWindow, and plugged
// in again once both boxes are back after a longer outage. What stops it
// is reported once, as an event of the key.
func (a *Agent) linkKey(ctx context.Context, lk *localKeys, u *edgeboxv1.UsbAssignment) {
	id, workload := u.GetKeyId(), u.GetWorkload()
	log := a.log.With("key", id, "workload", workload, "key_box", u.GetImportFrom())
	told := ""
	tell := func(reason, msg string, warning bool) {
		if msg != told {
			told = msg
			a.keyEvent(id, reason, msg, warning)
		}
	}
	var plugged runtime.RedirAttacher
	defer func() {
		if plugged != nil {
			if err := plugged.DetachRedir(workload, redirID(id)); err != nil {
				log.Warn("unplugging a remote key from its VM", "err", err)
			}
			tell(edgeboxv1.ReasonDetached, "from "+workload+": the lease ended", false)
		}
	}()
	wait := time.Second
	for ctx.Err() == nil {
		up := a.nextSession()
		err := a.linkOnce(ctx, lk, u, &plugged, func(msg string) { tell(edgeboxv1.ReasonAttached, msg, false) })
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Info("a remote key is not in its VM", "err", err)
			tell(edgeboxv1.ReasonNotAttachable, err.Error(), true)
		} else {
			wait = time.Second // it ran; a new outage starts short
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		case <-up: // the link is back: try now
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// linkOnce imports the key, plugs it into the VM and serves it there
// until the key is lost for good, the VM lets go, or ctx ends. Its OUT
// transfers are written behind (usbdev.WriteBehind): a command and the
// read of its answer cost one round trip to the key's box, not two.
func (a *Agent) linkOnce(ctx context.Context, lk *localKeys, u *edgeboxv1.UsbAssignment, plugged *runtime.RedirAttacher, attached func(string)) error {
	id, workload := u.GetKeyId(), u.GetWorkload()
	drv, err := a.redirDriver(ctx, workload)
	if err != nil && !errors.Is(err, errNotVM) {
		return err
	}
	dev, ierr := usbip.ImportResumable(ctx, a.keyDialer(id), id, keyResumeWindow, a.log.With("key", id))
	if ierr != nil {
		return fmt.Errorf("key %s on box %s: %w", id, u.GetImportFrom(), ierr)
	}
	defer dev.Close()
	a.remoteKeys.Add(1)
	defer a.remoteKeys.Add(-1)
	if err != nil { // a container or a program
		return a.offerLocally(ctx, lk, u, dev, attached)
	}
	sock, err := drv.AttachRedir(workload, redirID(id))
	if err != nil {
		return fmt.Errorf("plugging key %s into VM %s: %w", id, workload, err)
	}
	*plugged = drv
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("reaching VM %s's USB socket: %w", workload, err)
	}
	defer conn.Close()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-dev.Done(): // lost for longer than a blip: the guest sees it go
		case <-sctx.Done():
		}
		stop()
		conn.Close() // Serve reads QEMU's side until it closes
	}()
	attached(fmt.Sprintf("to VM %s, from box %s", workload, u.GetImportFrom()))
	err = usbredir.Serve(sctx, conn, usbdev.WriteBehind(dev), a.log.With("key", id))
	select {
	case <-dev.Done():
		return fmt.Errorf("key %s was unreachable for longer than %s: unplugged from VM %s until it is back: %w", id, keyResumeWindow, workload, dev.Err())
	default:
	}
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("the VM let go")
	}
	return fmt.Errorf("VM %s's USB socket: %w", workload, err)
}

// errNotVM is redirDriver's answer for a workload that runs, but not as
// a VM: its key is offered on the box's loopback instead.
var errNotVM = errors.New("not a VM")

// redirDriver is the driver running workload as a VM that takes usb-redir
// devices.
func (a *Agent) redirDriver(ctx context.Context, workload string) (runtime.RedirAttacher, error) {
	for _, d := range a.cfg.Drivers {
		in, err := d.Inspect(ctx, workload)
		if err != nil {
			continue
		}
		ra, ok := d.(runtime.RedirAttacher)
		switch {
		case !ok:
			return nil, fmt.Errorf("workload %s: %w", workload, errNotVM)
		case in.State != runtime.StateRunning:
			return nil, fmt.Errorf("VM %s is not running", workload)
		}
		return ra, nil
	}
	return nil, fmt.Errorf("workload %s does not run on this box", workload)
}

// keyDialer opens usbip streams for key id through the console, and
// reads its answer: the console's refusal says why.
func (a *Agent) keyDialer(id string) usbip.Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		octx, cancel := context.WithTimeout(ctx, keyOpenTimeout)
		defer cancel()
		c, err := a.tc.Open(octx, tunnel.KindUSBIP, map[string]string{forwarding.MetaKey: id})
		if err != nil {
			return nil, err
		}
		if dl, ok := octx.Deadline(); ok {
			c.SetReadDeadline(dl)
		}
		if err := forwarding.ReadReply(c); err != nil {
			c.Close()
			if msg, ok := strings.CutPrefix(err.Error(), forwarding.ErrRefused.Error()+": "); ok {
				return nil, fmt.Errorf("the console refused: %s", msg)
			}
			return nil, err
		}
		c.SetReadDeadline(time.Time{})
		return c, nil
	}
}

// localKeys is the box's loopback USB/IP server, where keys of other
// boxes leased to its containers and programs are offered. It listens
// only once a key is to be offered (most boxes never do), and stops with
// importKeys.
type localKeys struct {
	a  *Agent
	mu sync.Mutex
	// srv, ln and addr once it listens; err why it could not.
	srv  *usbip.Server
	ln   net.Listener
	addr string
	err  error
	wg   sync.WaitGroup
}

// defaultKeyServer is where keys are offered locally unless the agent is
// told otherwise: the USB/IP port, on loopback only.
const defaultKeyServer = "127.0.0.1:3240"

// server returns the listening server, starting it the first time.
func (lk *localKeys) server(ctx context.Context) (*usbip.Server, string, error) {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.srv != nil || lk.err != nil {
		return lk.srv, lk.addr, lk.err
	}
	addr := lk.a.cfg.KeyServer
	switch addr {
	case "off":
		lk.err = errors.New("this box offers no keys of other boxes to containers and programs (its key server is off)")
		return nil, "", lk.err
	case "":
		addr = defaultKeyServer
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(context.WithoutCancel(ctx), "tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("this box's key server cannot listen on %s: %w", addr, err)
	}
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		ln.Close()
		lk.err = fmt.Errorf("this box's key server must listen on loopback only, not %s", addr)
		return nil, "", lk.err
	}
	lk.srv, lk.ln, lk.addr = usbip.New(lk.a.log), ln, ln.Addr().String()
	lk.a.log.Info("keys of other boxes are offered to this box's containers and programs", "address", lk.addr)
	lk.wg.Add(1)
	go func() {
		defer lk.wg.Done()
		defer ln.Close()
		lk.srv.Serve(ln)
	}()
	return lk.srv, lk.addr, nil
}

// close stops the server, if it ran, and waits for it.
func (lk *localKeys) close() {
	lk.mu.Lock()
	if lk.srv != nil {
		lk.srv.Close()
		lk.ln.Close() // Serve returns once its accepting fails
	}
	lk.err = errors.New("the agent is stopping")
	lk.mu.Unlock()
	lk.wg.Wait()
}

// offerLocally offers an imported key on the box's loopback USB/IP
// server, under its key ID, until ctx ends or the key is lost for longer
// than a blip.
func (a *Agent) offerLocally(ctx context.Context, lk *localKeys, u *edgeboxv1.UsbAssignment, dev *usbip.Remote, attached func(string)) error {
	id := u.GetKeyId()
	srv, addr, err := lk.server(ctx)
	if err != nil {
		return fmt.Errorf("workload %s is not a VM: %w", u.GetWorkload(), err)
	}
	if err := srv.Add(id, usbdev.WriteBehind(described(ctx, dev, u))); err != nil {
		return err
	}
	defer srv.Remove(id)
	how := fmt.Sprintf("offered to %s over USB/IP on %s, bus ID %s (usbip attach -r %s -b %s), from box %s",
		u.GetWorkload(), addr, id, hostOf(addr), id, u.GetImportFrom())
	if port, err := a.attachVHCI(ctx, addr, id); err == nil {
		defer a.detachVHCI(id, port)
		how = fmt.Sprintf("given to %s through the kernel's vhci-hcd (port %d), from box %s", u.GetWorkload(), port, u.GetImportFrom())
	} else if !errors.Is(err, errNoVHCI) {
		a.log.Warn("a key of another box could not be attached through vhci-hcd; it stays offered on loopback", "key", id, "err", err)
	}
	attached(how)
	select {
	case <-ctx.Done():
		return nil
	case <-dev.Done():
		return fmt.Errorf("key %s was unreachable for longer than %s: no longer offered until it is back: %w", id, keyResumeWindow, dev.Err())
	}
}

func hostOf(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}

// errNoVHCI: the box's kernel has no vhci-hcd loaded.
var errNoVHCI = errors.New("no vhci-hcd")

// attachVHCI hands key id, offered on the local key server at addr, to
// the kernel's vhci-hcd where the box has it: the key then appears on
// the box's USB bus like a local one, and the workload holding its lease
// gets its device node (devicesFor).
func (a *Agent) attachVHCI(ctx context.Context, addr, id string) (int, error) {
	if _, err := os.Stat(filepath.Join(usbip.DefaultVHCIDir, "attach")); err != nil {
		return 0, errNoVHCI
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	port, err := usbip.AttachVHCI(ctx, conn, id)
	if err != nil {
		return 0, err
	}
	a.vhciMu.Lock()
	if a.vhci == nil {
		a.vhci = map[string]int{}
	}
	a.vhci[id] = port
	a.vhciMu.Unlock()
	a.reconciler.Kick() // its workload gets the device
	return port, nil
}

// detachVHCI takes key id off the box's USB bus again.
func (a *Agent) detachVHCI(id string, port int) {
	a.vhciMu.Lock()
	delete(a.vhci, id)
	a.vhciMu.Unlock()
	if err := usbip.DetachVHCI(port); err != nil {
		a.log.Warn("detaching a key of another box from vhci-hcd", "key", id, "port", port, "err", err)
	}
	a.reconciler.Kick()
}

// onVHCI reports whether key id, of another box, is on this box's USB bus
// through vhci-hcd.
func (a *Agent) onVHCI(id string) bool {
	a.vhciMu.Lock()
	defer a.vhciMu.Unlock()
	_, ok := a.vhci[id]
	return ok
}

// described is an imported key that says what it is as the key itself
// does: USB/IP's import tells neither its interfaces nor its serial,
// which a client listing the box's offer (usbip list) shows. They come
// from the key's configuration descriptor and from its assignment.
func described(ctx context.Context, dev usbdev.Device, u *edgeboxv1.UsbAssignment) usbdev.Device {
	info := dev.Info()
	info.Serial = u.GetSerial()
	rctx, cancel := context.WithTimeout(ctx, keyOpenTimeout)
	defer cancel()
	if cfg, err := usbdev.ReadConfig(rctx, dev); err == nil {
		info.Interfaces = info.Interfaces[:0:0]
		for _, in := range cfg.Interfaces {
			info.Interfaces = append(info.Interfaces, usbdev.Interface{Class: in.Class, SubClass: in.SubClass, Protocol: in.Protocol})
		}
	}
	return describedDevice{Device: dev, info: info}
}

type describedDevice struct {
	usbdev.Device
	info usbdev.Info
}

func (d describedDevice) Info() usbdev.Info { return d.info }
