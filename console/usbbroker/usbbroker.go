// Package usbbroker carries UKEYs between boxes. A box whose workload
// holds the lease of a key sitting on another box opens a usbip stream
// naming the key; the broker checks the lease, opens a usbip stream to
// the key's box, and joins the two, for as long as the lease lasts: the
// moment it ends or moves, the join is cut. Neither box opens a port,
// and each box reaches only the keys leased to it. Every join and its
// end go into the key's history, with both boxes.
package usbbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// openTimeout bounds reaching the key's box and hearing its answer.
const openTimeout = 10 * time.Second

// maxJoins bounds the keys carried at once; a box asking past it is told
// to come back.
const maxJoins = 1024

// Keys is the key registry, as the broker uses it.
type Keys interface {
	Remote(ctx context.Context, tenant, id, box string) (keys.Key, int64, error)
	Watch(ctx context.Context, tenant, id string, from int64) <-chan keys.Key
	RemoteEvent(ctx context.Context, tenant, id, event, detail string) error
}

// Opener opens a stream to a box: the tunnel server.
type Opener interface {
	Open(ctx context.Context, boxID string, kind tunnel.Kind, meta map[string]string) (net.Conn, error)
}

// stream is a tunnel stream as the broker reads it (*tunnel.Conn): the box
// it came from, and the key its header names.
type stream interface {
	net.Conn
	Peer() string
	Header() tunnel.Header
}

// Config is what a Broker needs.
type Config struct {
	Keys   Keys
	Boxes  func(ctx context.Context, id string) (fleet.Box, error)
	Tunnel Opener
	// Listener hands out the boxes' usbip streams.
	Listener net.Listener
	Log      *slog.Logger
}

// Broker joins the usbip streams of leased keys.
type Broker struct {
	cfg   Config
	slots chan struct{}
	wg    sync.WaitGroup
}

// New returns a broker; Run serves.
func New(cfg Config) *Broker {
	return &Broker{cfg: cfg, slots: make(chan struct{}, maxJoins)}
}

// Run serves usbip streams until ctx ends, then cuts every join and waits
// for them. It returns nil when ctx ended it.
func (b *Broker) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { b.cfg.Listener.Close() })
	defer stop()
	defer b.wg.Wait()
	for {
		c, err := b.cfg.Listener.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("usbbroker: %w", err)
		}
		select {
		case b.slots <- struct{}{}:
		default:
			forwarding.WriteReply(c, errdefs.Unavailable("the console carries %d keys already; try again later", maxJoins))
			c.Close()
			continue
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer func() { <-b.slots }()
			b.serve(ctx, c)
		}()
	}
}

// serve checks one box's stream against the lease, joins it to the key's
// box, and cuts the join when the lease ends or moves.
func (b *Broker) serve(ctx context.Context, c net.Conn) {
	defer c.Close()
	tc, ok := c.(stream)
	if !ok {
		return
	}
	holder, id := tc.Peer(), tc.Header().Meta[forwarding.MetaKey]
	log := b.cfg.Log.With("key", id, "box", holder)
	key, rev, err := b.check(ctx, holder, id)
	if err != nil {
		log.Info("a box was refused a key", "err", err)
		forwarding.WriteReply(c, err)
		return
	}
	log = log.With("key_box", key.BoxID, "workload", key.Holder)
	dev, err := b.open(ctx, key)
	if err != nil {
		log.Info("a leased key could not be reached", "err", err)
		forwarding.WriteReply(c, err)
		return
	}
	defer dev.Close()
	if err := forwarding.WriteReply(c, nil); err != nil {
		return
	}
	began := time.Now()
	b.history(ctx, key, "remote-attach", fmt.Sprintf("from box %s to box %s", key.BoxID, holder))
	log.Info("carrying a key between boxes")

	jctx, cut := context.WithCancel(ctx)
	defer cut()
	why := "a box closed the stream"
	var whyMu sync.Mutex
	go func() {
		for k := range b.cfg.Keys.Watch(jctx, key.TenantID, key.ID, rev) {
			if k.Holder != key.Holder || k.HolderBox != holder {
				whyMu.Lock()
				why = "the lease ended or moved"
				whyMu.Unlock()
				cut()
				return
			}
		}
		if jctx.Err() == nil { // the watch failed: fail closed
			whyMu.Lock()
			why = "the console could no longer follow the lease"
			whyMu.Unlock()
			cut()
		}
	}()
	up, down := forwarding.Join(jctx, c, dev)
	whyMu.Lock()
	if ctx.Err() != nil {
		why = "the console stopped"
	}
	ended := why
	whyMu.Unlock()
	log.Info("stopped carrying a key between boxes", "why", ended, "to_key", up, "from_key", down)
	b.history(context.WithoutCancel(ctx), key, "remote-detach", fmt.Sprintf("box %s: %s after %s; %d bytes to the key, %d from it",
		holder, ended, time.Since(began).Round(time.Second), up, down))
}

// check finds the key a box asks for, and that a workload of that box
// holds its lease.
func (b *Broker) check(ctx context.Context, holder, id string) (keys.Key, int64, error) {
	if id == "" || len(id) > 64 {
		return keys.Key{}, 0, errdefs.Invalid("a usbip stream must name its key")
	}
	box, err := b.cfg.Boxes(ctx, holder)
	if err != nil {
		return keys.Key{}, 0, err
	}
	return b.cfg.Keys.Remote(ctx, box.TenantID, id, holder)
}

// open reaches the key on its box: a usbip stream, and the box's answer.
func (b *Broker) open(ctx context.Context, key keys.Key) (net.Conn, error) {
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	dev, err := b.cfg.Tunnel.Open(octx, key.BoxID, tunnel.KindUSBIP, map[string]string{forwarding.MetaKey: key.ID})
	if err != nil {
		if errors.Is(err, tunnel.ErrOffline) {
			return nil, errdefs.Unavailable("the key's box %s is offline", key.BoxID)
		}
		return nil, errdefs.Unavailable("reaching the key's box %s: %v", key.BoxID, err)
	}
	dev.SetReadDeadline(time.Now().Add(openTimeout))
	if err := forwarding.ReadReply(dev); err != nil {
		dev.Close()
		return nil, errdefs.Unavailable("the key's box %s: %v", key.BoxID, unwrapRefusal(err))
	}
	dev.SetReadDeadline(time.Time{})
	return dev, nil
}

// unwrapRefusal is a box's reason without the forward's wording around it.
func unwrapRefusal(err error) string {
	msg := err.Error()
	if p := forwarding.ErrRefused.Error() + ": "; len(msg) > len(p) && msg[:len(p)] == p {
		return msg[len(p):]
	}
	return msg
}

func (b *Broker) history(ctx context.Context, k keys.Key, event, detail string) {
	if err := b.cfg.Keys.RemoteEvent(ctx, k.TenantID, k.ID, event, detail); err != nil {
		b.cfg.Log.Warn("writing a key's history", "key", k.ID, "event", event, "err", err)
	}
}
