package sessions

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// KindScreen is a VM's screen over VNC.
const KindScreen = "screen"

// metaWorkload names the VM whose screen a vnc stream wants (the agent's
// forward.MetaWorkload).
const metaWorkload = "workload"

// ScreenRequest is an operator's ask for a VM's screen; the caller has
// checked the role and the box.
type ScreenRequest struct {
	TenantID, Box, BoxName, Workload, User, Remote string
	// ViewOnly passes no key, pointer or clipboard to the VM.
	ViewOnly bool
	// Approved is the approved request it opens with (Take), on a
	// four-eyes box.
	Approved *Record
}

// Screen carries a VM's screen between the operator's viewer (conn: RFB
// over a WebSocket, as noVNC speaks it) and the VM's VNC socket on the
// box, until either ends, it sits idle, or a user ends it. It is audited
// as a session of kind "screen", with who, box, VM, start, end and bytes.
func (b *Broker) Screen(ctx context.Context, req ScreenRequest, conn net.Conn) {
	defer conn.Close()
	now := b.cfg.Now()
	rec := Record{ID: newID(now), TenantID: req.TenantID, Box: req.Box, BoxName: req.BoxName, Workload: req.Workload,
		Kind: KindScreen, User: req.User, Remote: req.Remote, Started: now, ViewOnly: req.ViewOnly}
	if req.Approved != nil {
		rec = *req.Approved
		rec.Started = now
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	mode := "interactive"
	if rec.ViewOnly {
		mode = "view only"
	}
	done, ok := b.begin(ctx, rec, cancel, "screen.open", fmt.Sprintf("screen %s of VM %s, %s", rec.ID, rec.Workload, mode))
	if !ok {
		return
	}
	defer done()
	var in, out atomic.Int64
	var last atomic.Int64
	last.Store(now.UnixNano())
	result := "ok"
	vm, err := b.cfg.Tunnel.Open(sctx, rec.Box, tunnel.KindVNC, map[string]string{metaWorkload: rec.Workload})
	if err == nil {
		if err = forwarding.ReadReply(vm); err != nil {
			vm.Close()
		}
	}
	if err != nil {
		rec.EndedBy, result = "refused", fmt.Sprintf("box %s: %v", cmpOr(rec.BoxName, rec.Box), err)
	} else {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-sctx.Done():
					return
				case <-t.C:
				}
				n := b.cfg.Now()
				switch {
				case n.Sub(time.Unix(0, last.Load())) >= b.cfg.IdleTimeout:
					cancel(errIdle)
				case n.Sub(rec.Started) >= b.cfg.MaxDuration:
					cancel(errTooLong)
				}
			}
		}()
		go func() {
			<-sctx.Done()
			conn.Close()
			vm.Close()
		}()
		done := make(chan error, 1)
		go func() {
			// The VM's screen to the viewer.
			_, err := io.Copy(countingWriter{conn, &out}, vm)
			cancel(errBoxGone) // the VM or its box went: the viewer's side ends too
			done <- err
		}()
		// The viewer's input to the VM, read message by message: keys and
		// the pointer are what keep a screen from being idle (a viewer
		// asks for updates all the time), and view only drops them.
		f := &viewOnly{r: countingReader{conn, &in}, interactive: !rec.ViewOnly,
			onInput: func() { last.Store(b.cfg.Now().UnixNano()) }}
		ierr := f.copy(vm)
		if errors.Is(ierr, ErrRFB) {
			cancel(ierr)
			result = ierr.Error()
		} else {
			cancel(errOpGone)
		}
		<-done
		vm.Close()
		rec.EndedBy = cmpOr(causeName(context.Cause(sctx)), "box")
		if errors.Is(context.Cause(sctx), ErrRFB) {
			rec.EndedBy = "bad input"
		}
	}
	ended := b.cfg.Now()
	rec.Ended, rec.BytesIn, rec.BytesOut = &ended, in.Load(), out.Load()
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer wcancel()
	if err := b.put(wctx, rec, audit.Entry{TenantID: rec.TenantID, Actor: rec.User, Remote: rec.Remote,
		Action: "screen.end", Target: target(rec), Result: result,
		Detail: fmt.Sprintf("screen %s of VM %s (%s) ended by %s after %s; %d bytes in, %d out", rec.ID, rec.Workload, mode,
			rec.EndedBy, ended.Sub(rec.Started).Round(time.Second), rec.BytesIn, rec.BytesOut)}); err != nil {
		b.cfg.Log.Error("a screen's end could not be recorded", "session", rec.ID, "err", err)
	}
}

// countingReader and countingWriter count the bytes that pass.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
