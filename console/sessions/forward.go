package sessions

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// KindForward is a port forward: one target, any number of connections.
const KindForward = "forward"

// maxForwardConns bounds the connections one forward carries at once.
const maxForwardConns = forwarding.MaxConns

// Tunnel opens streams to boxes.
type Tunnel interface {
	Open(ctx context.Context, box string, kind tunnel.Kind, meta map[string]string) (net.Conn, error)
}

// ForwardRequest is an operator's ask for a port forward; the caller has
// checked the role, the box and the target against the allow lists.
type ForwardRequest struct {
	TenantID, Box, BoxName, Target, User, Remote string
	// Approved is the approved request it opens with (Take), on a
	// four-eyes box.
	Approved *Record
}

// Forward carries a port forward over conn, the operator's WebSocket,
// until the operator leaves, it sits idle, it runs too long, or a user
// ends it. The operator opens a stream per connection; each gets the
// box's reply (forwarding.ReadReply) and then the target's bytes.
func (b *Broker) Forward(ctx context.Context, req ForwardRequest, conn net.Conn) {
	defer conn.Close()
	now := b.cfg.Now()
	rec := Record{ID: newID(now), TenantID: req.TenantID, Box: req.Box, BoxName: req.BoxName, Kind: KindForward,
		Target: req.Target, User: req.User, Remote: req.Remote, Started: now}
	if req.Approved != nil {
		rec = *req.Approved
		rec.Started = now
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done, ok := b.begin(ctx, rec, cancel, "forward.open", fmt.Sprintf("forward %s to %s", rec.ID, rec.Target))
	if !ok {
		return
	}
	defer done()
	ys, err := forwarding.Server(conn)
	if err != nil {
		return
	}
	var in, out, conns, active atomic.Int64
	var last atomic.Int64
	last.Store(now.UnixNano())
	go func() {
		<-fctx.Done()
		ys.Close()
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-fctx.Done():
				return
			case <-t.C:
			}
			n := b.cfg.Now()
			switch {
			case active.Load() == 0 && n.Sub(time.Unix(0, last.Load())) >= b.cfg.IdleTimeout:
				cancel(errIdle)
			case n.Sub(rec.Started) >= b.cfg.MaxDuration:
				cancel(errTooLong)
			}
		}
	}()
	for {
		st, err := ys.AcceptStream()
		if err != nil {
			if fctx.Err() == nil {
				cancel(errOpGone)
			}
			break
		}
		if active.Load() >= maxForwardConns {
			forwarding.WriteReply(st, fmt.Errorf("this forward carries %d connections already", maxForwardConns))
			st.Close()
			continue
		}
		active.Add(1)
		conns.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer active.Add(-1)
			defer st.Close()
			tc, err := b.cfg.Tunnel.Open(fctx, rec.Box, tunnel.KindForward, map[string]string{forwarding.MetaTarget: rec.Target})
			if err != nil {
				forwarding.WriteReply(st, fmt.Errorf("box %s: %v", cmpOr(rec.BoxName, rec.Box), err))
				return
			}
			defer tc.Close()
			err = forwarding.ReadReply(tc)
			if err != nil && !errors.Is(err, forwarding.ErrRefused) {
				err = fmt.Errorf("box %s: %v", cmpOr(rec.BoxName, rec.Box), err)
			}
			if forwarding.WriteReply(st, err) != nil || err != nil {
				return
			}
			a, c := forwarding.Join(fctx, st, tc)
			in.Add(a)
			out.Add(c)
			last.Store(b.cfg.Now().UnixNano())
		}()
	}
	cancel(errOpGone)
	wg.Wait()
	ended := b.cfg.Now()
	rec.Ended, rec.BytesIn, rec.BytesOut, rec.Conns = &ended, in.Load(), out.Load(), conns.Load()
	rec.EndedBy = causeName(context.Cause(fctx))
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer wcancel()
	if err := b.put(wctx, rec, audit.Entry{TenantID: rec.TenantID, Actor: rec.User, Remote: rec.Remote,
		Action: "forward.end", Target: target(rec), Result: "ok",
		Detail: fmt.Sprintf("forward %s to %s ended by %s after %s; %d connections, %d bytes in, %d out", rec.ID, rec.Target,
			rec.EndedBy, ended.Sub(rec.Started).Round(time.Second), rec.Conns, rec.BytesIn, rec.BytesOut)}); err != nil {
		b.cfg.Log.Error("a forward's end could not be recorded", "session", rec.ID, "err", err)
	}
}

// DialForward opens a connection from box to target through its tunnel,
// after the box's reply; the caller has checked the target.
func (b *Broker) DialForward(ctx context.Context, box, target string) (net.Conn, error) {
	tc, err := b.cfg.Tunnel.Open(ctx, box, tunnel.KindForward, map[string]string{forwarding.MetaTarget: target})
	if err != nil {
		return nil, err
	}
	if err := forwarding.ReadReply(tc); err != nil {
		tc.Close()
		return nil, err
	}
	return tc, nil
}
