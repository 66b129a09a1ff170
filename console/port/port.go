package port

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/tunnel"
)

// Port accepts every connection on the public port, completes its TLS
// handshake under a deadline, and hands it to the tunnel or to HTTP by the
// negotiated ALPN protocol.
//
// Admission (limits.go) keeps it available to boxes and operators when
// someone holds thousands of connections open: a connection holds a
// handshake slot only from its ClientHello on, boxes (the tunnel ALPN) and
// everyone else draw from separate pools, each source address has caps,
// and connections that never speak are closed first.
type Port struct {
	ln       net.Listener
	tunnel   *tunnel.Server
	http     *connListener
	tls      *tls.Config
	gate     Gate
	cpu      chan struct{} // a slot for each box handshake computing now
	cfg      Config
	log      *slog.Logger
	adm      *admission
	logEvery time.Duration  // how often shedding is summed up in the log
	hellos   sync.Map       // the conn TLS reads → its *portConn, while its handshake runs
	keys     *pki.Authority // keeps the session ticket keys
	closing  chan net.Conn  // connections shed by the accept loop, for the closer
	wg       sync.WaitGroup
}

// Gate admits box sessions before their TLS handshake
// (console/admission's Controller is the console's).
type Gate interface {
	// Reserve holds a place for a box session about to handshake and
	// returns a context that carries it to the tunnel's Admit, or says how
	// long the box should wait before it dials again. It may wait up to
	// patience for a place to free. release gives the place back when the
	// session does not come up.
	Reserve(ctx context.Context, patience time.Duration) (rctx context.Context, release func(), wait time.Duration)
}

// shedLogEvery is how often the port logs what it shed, if anything.
const shedLogEvery = 5 * time.Second

// New returns the port on ln, serving the certificate of a to everyone
// and requiring a certificate a signed from boxes, whose sessions go to
// srv once gate lets their handshake start. Its metrics are registered
// with reg when reg is not nil. It starts nothing; Run serves, and owns ln
// from then on.
func New(ln net.Listener, a *pki.Authority, srv *tunnel.Server, gate Gate, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Port, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("port: %w", err)
	}
	return newPort(ln, a, srv, gate, newAdmission(cfg.limits(), reg), cfg, log), nil
}

func newPort(ln net.Listener, a *pki.Authority, srv *tunnel.Server, gate Gate, adm *admission, cfg Config, log *slog.Logger) *Port {
	p := &Port{ln: ln, tunnel: srv, gate: gate, cfg: cfg, log: log, adm: adm, logEvery: shedLogEvery,
		http: newConnListener(ln.Addr()),
		cpu:  make(chan struct{}, handshakeCPU()),
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
			v, ok := p.hellos.Load(hello.Conn)
			if !ok {
				return nil, errors.New("port: connection not admitted")
			}
			pc := v.(*portConn)
			box := slices.Contains(hello.SupportedProtos, tunnel.ALPN)
			if reason, ok := p.adm.hello(pc, box); !ok {
				if reason == "" {
					return nil, errors.New("port: connection closed for a newer one")
				}
				if box {
					// A box is told to come back soon rather than failed:
					// a failed handshake costs it its session ticket and
					// sends it into its back-off.
					pc.tellBusy(cpuWait/2 + rand.N(cpuWait))
					return nil, fmt.Errorf("port: too busy for another handshake (%s): %w", reason, errEarlyBusy)
				}
				return nil, fmt.Errorf("port: too busy for another handshake (%s)", reason)
			}
			pc.SetDeadline(pc.start.Add(p.cfg.HandshakeTimeout))
			if !box {
				return apiTLS, nil
			}
			// Box sessions are admitted here, before any expensive crypto,
			// at the pace the console completes them; the rest wait for a
			// place, as long as their handshake leaves time for, or are
			// told when to come back, so a reconnect storm cannot crowd
			// out operators or the boxes already in.
			// A box may wait in the queue for longer than the handshake
			// timeout allows a client: as long as the box itself waits
			// for its handshake, less the handshake's own time, which
			// starts again once the box has its place.
			patience := time.Until(pc.start.Add(boxHandshakeWait)) - cpuWait - handshakeWork
			pc.setHandshakeEnd(pc.start.Add(boxHandshakeWait))
			ctx, release, wait := p.gate.Reserve(pc.serving, max(0, patience))
			end := time.Now().Add(cpuWait + handshakeWork)
			if limit := pc.start.Add(p.cfg.HandshakeTimeout); end.Before(limit) {
				end = limit
			}
			pc.setHandshakeEnd(end)
			if wait > 0 {
				pc.tellBusy(wait)
				return nil, fmt.Errorf("port: box told to come back in %s: %w", wait.Round(time.Millisecond), errEarlyBusy)
			}
			pc.admitted, pc.release = ctx, release
			// The expensive part of a box's handshake, from here to its
			// first flight, runs a few at a time: the others wait blocked,
			// not runnable, so operators' requests and the sessions
			// already in never queue behind thousands of handshakes for
			// the CPU. A box that waits too long is told to come back
			// soon rather than failed: a failed handshake would cost it
			// its session ticket, and the next one a full handshake.
			t := time.NewTimer(cpuWait)
			defer t.Stop()
			select {
			case p.cpu <- struct{}{}:
				pc.cpu.Store(&p.cpu)
			case <-t.C:
				pc.admitted, pc.release = nil, nil
				release()
				p.adm.shed.count(shedBoxCPU, pc.addr)
				pc.tellBusy(cpuWait/2 + rand.N(cpuWait))
				return nil, fmt.Errorf("port: box told to come back: %w", errEarlyBusy)
			case <-hello.Context().Done():
				return nil, hello.Context().Err()
			}
			return tunnelTLS, nil
		},
	}
	p.keys = a
	p.rotateTicketKeys()
	return p
}

// rotateTicketKeys sets the session ticket keys kept with the PKI, moving
// to a new one when it is due. Kept across restarts, they let a fleet
// redialling a restarted console resume its TLS sessions; without them
// (an unwritable directory) Go's own keys serve, and only resumption
// across a restart is lost.
func (p *Port) rotateTicketKeys() {
	keys, err := p.keys.TicketKeys(time.Now())
	if err != nil {
		p.log.Warn("TLS session ticket keys not kept; boxes will not resume their sessions across a restart", "err", err)
		return
	}
	p.tls.SetSessionTicketKeys(keys)
}

// ticketKeyCheck is how often the port looks whether a new session
// ticket key is due.
const ticketKeyCheck = time.Hour

// handshakeCPU is how many box handshakes compute at once: four for each
// CPU the console may use, as a handshake's goroutine also waits for its
// turn on the CPU while it holds its slot.
func handshakeCPU() int { return 4 * runtime.GOMAXPROCS(0) }

// handshakeWork is the time a box's handshake is left for its crypto and
// its first flights, after any wait for a place and a slot.
const handshakeWork = 2 * time.Second

// boxHandshakeWait is how long a box waits for its TLS handshake, from
// its dial: the agent's tunnel client gives dial and handshake 30 s.
const boxHandshakeWait = 25 * time.Second

// cpuWait bounds a box's wait for a handshake slot; past it the box is
// told to come back in 1 to 3 s.
const cpuWait = 2 * time.Second

// HTTP is the listener of the connections that did not ask for the
// tunnel, their TLS handshake done. It closes when Run returns.
func (p *Port) HTTP() net.Listener { return p.http }

// Run accepts until ctx ends, then closes the listener and returns nil.
// It survives errors a busy or flaky host gives (out of file descriptors,
// aborted connections, timeouts) with a back-off, and returns any other
// error of the listener, net.ErrClosed included when ctx has not ended:
// the port serves nothing then, and the console must not go on as if it
// did. Either way it returns once every connection it accepted is a box
// session, handed to HTTP or closed; then HTTP's listener closes.
func (p *Port) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	stopClose := context.AfterFunc(ctx, func() { p.ln.Close() }) // wakes Accept
	logDone := make(chan struct{})
	go func() { defer close(logDone); p.logShedding(ctx) }()

	// Connections shed as the accept loop takes new ones are closed by a
	// goroutine of their own: a close is the costliest system call of a
	// flood, and the accept loop must drain the kernel's queue, where an
	// operator's connection waits behind the flood's.
	p.closing = make(chan net.Conn, 4096)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for c := range p.closing {
			abort(c)
		}
	}()
	// Several goroutines take connections off the listener: under a
	// flood, one alone waits its turn for the CPU behind the goroutines
	// of the connections it took, after each system call, while an
	// operator's connection waits in the kernel's queue behind the
	// flood's.
	n := min(8, max(2, 2*runtime.GOMAXPROCS(0)))
	errs := make(chan error, n)
	for range n {
		go func() {
			err := p.accept(ctx)
			if err != nil {
				cancel() // the others stop too
			}
			errs <- err
		}()
	}
	var err error
	for range n {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	close(p.closing)
	<-closed
	// On a failure too, the listener closes and handshakes in progress
	// end at once.
	cancel()
	stopClose()
	p.ln.Close()
	<-logDone
	p.wg.Wait()
	p.http.Close()
	return err
}

// accept accepts until ctx ends or the listener fails.
func (p *Port) accept(ctx context.Context) error {
	var backoff time.Duration
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil // the listener was closed on purpose
			}
			if !acceptRetryable(err) {
				return fmt.Errorf("port: accepting on %s: %w", p.ln.Addr(), err)
			}
			// Out of file descriptors, or a connection gone before it was
			// accepted: never a reason to stop serving. Idle connections
			// give their descriptors back first.
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				p.adm.shed.count(shedAcceptError, netip.Addr{})
				for _, old := range p.adm.evictIdle(64) {
					p.shed(old.Conn)
				}
			} else {
				p.log.Debug("accept failed", "err", err)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		backoff = 0
		pc, evicted := p.adm.admit(c, time.Now())
		for _, old := range evicted {
			p.shed(old.Conn)
		}
		if pc == nil {
			p.shed(c)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(ctx, pc)
		}()
	}
}

// shed has the closing goroutine abort c, or aborts it here when that
// goroutine is behind.
func (p *Port) shed(c net.Conn) {
	select {
	case p.closing <- c:
	default:
		abort(c)
	}
}

// abort closes a connection that never got as far as a handshake with a
// reset: the console keeps no TIME_WAIT for it, which thousands of idle
// connections shed a second would otherwise pile up in its kernel.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// logShedding sums up what was shed in one log line per logEvery, and
// rotates the session ticket keys when due, until ctx ends.
func (p *Port) logShedding(ctx context.Context) {
	t := time.NewTicker(p.logEvery)
	defer t.Stop()
	keys := time.NewTicker(ticketKeyCheck)
	defer keys.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.adm.shed.log(p.log, p.logEvery)
		case <-keys.C:
			p.rotateTicketKeys()
		}
	}
}

func (p *Port) handle(ctx context.Context, pc *portConn) {
	cc := tunnel.CorkConn(pc)
	pc.serving = ctx
	p.hellos.Store(cc, pc)
	tc := tls.Server(cc, p.tls)
	hctx, cancel := context.WithCancel(ctx)
	pc.handshakeEnd = time.AfterFunc(time.Until(pc.start.Add(p.cfg.HandshakeTimeout)), cancel)
	// Until its ClientHello is in, a connection holds no handshake slot,
	// and gets a shorter deadline.
	pc.SetDeadline(pc.start.Add(min(p.cfg.HelloTimeout, p.cfg.HandshakeTimeout)))
	err := tc.HandshakeContext(hctx)
	pc.handshakeEnd.Stop()
	cancel()
	pc.computed()
	p.hellos.Delete(cc)
	if err != nil {
		if pc.release != nil {
			pc.release()
		}
		if ctx.Err() == nil && isTimeout(err) {
			p.adm.timedOutIdle(pc)
			abort(pc.Conn)
		}
		if !errors.Is(err, errEarlyBusy) {
			p.log.Debug("TLS handshake failed", "remote", pc.RemoteAddr().String(), "err", err)
		}
		pc.Close()
		return
	}
	pc.SetDeadline(time.Time{})
	cs := tc.ConnectionState()
	p.adm.shed.metrics.handshake(cs.NegotiatedProtocol == tunnel.ALPN, cs.DidResume)
	if cs.NegotiatedProtocol == tunnel.ALPN {
		p.adm.handshakeDone(pc, true)
		sctx := ctx
		if pc.admitted != nil {
			sctx = pc.admitted
		}
		err := p.tunnel.ServeConn(sctx, tc)
		if err != nil && pc.release != nil {
			pc.release()
		}
		if errors.Is(err, tunnel.ErrBusy) {
			// Admission counts and logs these as a rate.
			p.log.Debug("box told to come back later", "remote", pc.RemoteAddr().String(), "err", err)
		} else if err != nil {
			p.log.Info("box session refused", "remote", pc.RemoteAddr().String(), "err", err)
		}
		return
	}
	p.adm.handshakeDone(pc, false)
	if !p.http.deliver(ctx, tc) {
		tc.Close()
	}
}

// errEarlyBusy ends the TLS handshake of a box told to come back later.
var errEarlyBusy = errors.New("no room for another box session now")

// acceptRetryable reports whether an Accept error passes with time: a
// timeout, an error the net package calls temporary (EMFILE, ENFILE,
// ECONNABORTED, ECONNRESET, EINTR, …), or one of the errors Linux's
// accept(2) passes on from the network for a single connection. Any other
// error, net.ErrClosed first, means the listener is gone.
func acceptRetryable(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	if isTimeout(err) {
		return true
	}
	var tmp interface{ Temporary() bool }
	if errors.As(err, &tmp) && tmp.Temporary() {
		return true
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.EPERM, syscall.EPROTO, syscall.ENETDOWN, syscall.ENETUNREACH,
		syscall.EHOSTUNREACH, syscall.EHOSTDOWN, syscall.ENOPROTOOPT, syscall.EOPNOTSUPP} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

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
