package console

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/tunnel"
)

// port accepts every connection on the public port, completes its TLS
// handshake under a deadline, and hands it to the tunnel or to HTTP by the
// negotiated ALPN protocol.
type port struct {
	ln      net.Listener
	tunnel  *tunnel.Server
	http    *connListener
	tls     *tls.Config
	limiter *rate.Limiter
	cfg     Config
	log     *slog.Logger
	slots   chan struct{} // one per handshake in progress
	wg      sync.WaitGroup
}

func newPort(ln net.Listener, a *pki.Authority, srv *tunnel.Server, cfg Config, log *slog.Logger) *port {
	p := &port{ln: ln, tunnel: srv, cfg: cfg, log: log,
		http:    newConnListener(ln.Addr()),
		limiter: rate.NewLimiter(rate.Limit(cfg.HandshakeRate), cfg.HandshakeBurst),
		slots:   make(chan struct{}, cfg.MaxHandshakes),
	}
	apiTLS := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.Server},
		NextProtos:   []string{"h2", "http/1.1"},
	}
	tunnelTLS := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{a.Server},
		NextProtos:   []string{tunnel.ALPN},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    a.Pool(),
	}
	p.tls = &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			if !slices.Contains(hello.SupportedProtos, tunnel.ALPN) {
				return apiTLS, nil
			}
			// Box sessions queue here, before any expensive crypto, so a
			// reconnect storm cannot crowd out operators.
			if err := p.limiter.Wait(hello.Context()); err != nil {
				return nil, err
			}
			return tunnelTLS, nil
		},
	}
	return p
}

func (p *port) serve(ctx context.Context) {
	defer p.http.Close()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return
		}
		select {
		case p.slots <- struct{}{}:
		default:
			c.Close() // too many handshakes at once
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(ctx, c)
		}()
	}
}

func (p *port) handle(ctx context.Context, c net.Conn) {
	tc := tls.Server(tunnel.CorkConn(c), p.tls)
	hctx, cancel := context.WithTimeout(ctx, p.cfg.HandshakeTimeout)
	c.SetDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	err := tc.HandshakeContext(hctx)
	cancel()
	<-p.slots
	if err != nil {
		p.log.Debug("TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	if tc.ConnectionState().NegotiatedProtocol == tunnel.ALPN {
		if err := p.tunnel.ServeConn(ctx, tc); err != nil {
			p.log.Info("box session refused", "remote", c.RemoteAddr().String(), "err", err)
		}
		return
	}
	if !p.http.deliver(ctx, tc) {
		tc.Close()
	}
}

// wait waits for every connection handler.
func (p *port) wait() { p.wg.Wait() }

// connListener is a net.Listener fed with connections from port.
type connListener struct {
	addr   net.Addr
	ch     chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, ch: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *connListener) deliver(ctx context.Context, c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		return false
	case <-ctx.Done():
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }
