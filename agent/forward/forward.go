// Package forward serves the console's port forwards on a box: each
// forward stream of the tunnel names a TCP target, on the box or on its
// LAN, which the box dials and joins to the stream. Which targets an
// operator may reach is the console's to decide (its allow lists); the
// box checks that a target is well formed, bounds how many forwards run
// at once, and says why a dial failed.
package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// Config tunes a Server.
type Config struct {
	// Dial connects to a target; nil is a net.Dialer's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds one dial; 0 is 10 s.
	DialTimeout time.Duration
	// MaxConns bounds the forwards running at once; 0 is 256. Past it a
	// forward is refused, with why.
	MaxConns int
	Log      *slog.Logger
}

// Serve answers the forward streams ln accepts until it closes.
func Serve(ctx context.Context, ln net.Listener, cfg Config) error {
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 256
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return acceptEach(ctx, ln, cfg.MaxConns, "forwards", func(c net.Conn) { serve(ctx, c, cfg) })
}

// acceptEach runs handle for each stream ln accepts, at most max at once
// (past it, a stream is refused with why), until ln closes or ctx ends;
// it waits for the handlers.
func acceptEach(ctx context.Context, ln net.Listener, max int, what string, handle func(net.Conn)) error {
	slots := make(chan struct{}, max)
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		select {
		case slots <- struct{}{}:
		default:
			forwarding.WriteReply(c, fmt.Errorf("this box runs %d %s already", max, what))
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			handle(c)
		}()
	}
}

// serve dials one forward's target and joins it to the stream.
func serve(ctx context.Context, c net.Conn, cfg Config) {
	defer c.Close()
	target := ""
	if tc, ok := c.(*tunnel.Conn); ok {
		target = tc.Header().Meta[forwarding.MetaTarget]
	}
	if _, _, err := forwarding.ParseTarget(target); err != nil {
		forwarding.WriteReply(c, err)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	t, err := cfg.Dial(dctx, "tcp", target)
	cancel()
	if err != nil {
		cfg.Log.Info("a forward's target did not answer", "target", target, "err", err)
		forwarding.WriteReply(c, fmt.Errorf("connecting to %s from the box: %v", target, err))
		return
	}
	defer t.Close()
	if err := forwarding.WriteReply(c, nil); err != nil {
		return
	}
	forwarding.Join(ctx, c, t)
}
