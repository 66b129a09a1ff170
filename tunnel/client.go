package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/net/http/httpproxy"
)

// ClientConfig configures the box side.
type ClientConfig struct {
	Config
	// Addr is the console's host:port.
	Addr string
	// Also are the console's other addresses (host:port): its replicas,
	// where no one name reaches them all. The client starts at one of
	// Addr and Also picked at random, and moves on to the next after a
	// dial that brought no session up, with its usual back-off between
	// dials; a console that answered busy said when to come back, and is
	// dialled again. Each address's host is the TLS server name its
	// certificate must match.
	Also []string
	// TLS must carry the pinned console CA (RootCAs) and the box
	// certificate (Certificates or GetClientCertificate). Dial adds the
	// tunnel ALPN, TLS 1.3 and a session cache for resumption.
	TLS *tls.Config
	// Proxy picks a CONNECT proxy, http:// or https://; nil reads
	// HTTPS_PROXY (or https_proxy) and NO_PROXY from the environment.
	Proxy ProxyFunc
	// ProxyRoots verifies an https:// proxy's certificate; nil uses the
	// system's roots, as a browser behind that proxy would.
	ProxyRoots *x509.CertPool
	// ProxySource names the setting Proxy comes from, for errors that ask
	// the operator to correct it (a proxy refusing its credentials), e.g.
	// `the "proxy" setting in /var/lib/edgebox/agent.json`. With a nil
	// Proxy it is the environment variable that was read.
	ProxySource string
	// Dial opens TCP connections; nil uses net.Dialer. Tests put a
	// toxiproxy or a fault injector here.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Backoff between failed dials; zero uses 1 s to 60 s. A session
	// that was healthy, or that the console ended with a goodbye, resets
	// it (see redial).
	Backoff Backoff
	// Rejoin is the window the box redials within after the console said
	// goodbye or a healthy session broke: a uniform wait in [0, Rejoin].
	// Zero uses DefaultRejoin, or Backoff.Max when that is shorter.
	Rejoin time.Duration
	// Name is this side's identity in stream addresses; "box" if empty.
	Name string
	// Renew says when a session that carried bulk data is replaced; the
	// zero value never renews.
	Renew Renewal
	// Metrics, if set, counts this side's session set-ups, sessions,
	// streams, bytes and pings; nil counts nothing.
	Metrics *Metrics
}

// Validate reports the first setting that cannot work.
func (c ClientConfig) Validate() error {
	if c.Addr == "" {
		return errors.New("tunnel: ClientConfig.Addr is required")
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("tunnel: console address %q: %w", c.Addr, err)
	}
	for _, a := range c.Also {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("tunnel: console address %q: %w", a, err)
		}
	}
	if c.TLS == nil || c.TLS.RootCAs == nil {
		return errors.New("tunnel: ClientConfig.TLS with the pinned console CA is required")
	}
	if c.Backoff.Min < 0 || c.Backoff.Max < c.Backoff.Min {
		return errors.New("tunnel: Backoff.Max must be at least Backoff.Min")
	}
	if c.Rejoin < 0 || c.Rejoin > c.Backoff.Max {
		return errors.New("tunnel: Rejoin must be between 0 and Backoff.Max")
	}
	if c.Renew.After < 0 || (c.Renew.After > 0 && c.Renew.Idle <= 0) {
		return errors.New("tunnel: Renew.After must not be negative, and Renew.Idle must be positive when it is set")
	}
	return c.Config.Validate()
}

// Client is the box side: Run keeps one session to the console up for as
// long as its context lives. Listen and Open work across reconnects.
type Client struct {
	cfg     ClientConfig
	addrs   []consoleAddr // Addr and Also, in the order they are tried
	next    atomic.Int32  // index in addrs of the address to dial
	tickets *ticketCache
	log     *slog.Logger
	routes  listeners

	// OnSession, when set before Run, is called synchronously each time a
	// session comes up and when it ends; it must not block.
	OnSession func(s *Session, up bool)
	// OnDialError, when set before Run, is called with the error of each
	// dial that brought no session up (the console unreachable or
	// refusing, a proxy that wants other credentials); it must not block.
	OnDialError func(error)
	// Hurry, when set before Run, is asked after each failed dial: while
	// it reports true the box waits at most Backoff.Min before the next,
	// however many failed before, so that what waits on the link (a
	// remote UKEY held within its resume window) gets it back as soon as
	// the link returns. A busy console's wait is kept. While it reports
	// true, the rejoin window is also the box's own, whatever the console
	// advised (AdviseRejoin). It must not block.
	Hurry func() bool

	// advised is the rejoin window the console last told (AdviseRejoin),
	// 0 for none.
	advised atomic.Int64

	mu      sync.Mutex    // guards current and ready
	current *Session      // nil while disconnected
	ready   chan struct{} // closed when current becomes non-nil
}

// NewClient validates cfg; it starts nothing.
func NewClient(cfg ClientConfig, log *slog.Logger) (*Client, error) {
	if cfg.Backoff.Min == 0 && cfg.Backoff.Max == 0 {
		cfg.Backoff = Backoff{Min: time.Second, Max: time.Minute, Rand: cfg.Backoff.Rand}
	}
	if cfg.Rejoin == 0 {
		cfg.Rejoin = min(DefaultRejoin, cfg.Backoff.Max)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		cfg.Name = "box"
	}
	if cfg.Proxy == nil {
		env := httpproxy.FromEnvironment().ProxyFunc()
		cfg.Proxy = func(u *url.URL) (*url.URL, error) { return env(u) }
		cfg.ProxySource = envProxySource()
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		cfg.Dial = d.DialContext
	}
	t := cfg.TLS.Clone()
	t.MinVersion = tls.VersionTLS13
	t.NextProtos = []string{ALPN}
	if t.ClientSessionCache == nil {
		t.ClientSessionCache = tls.NewLRUClientSessionCache(4 * (1 + len(cfg.Also)))
	}
	tickets := &ticketCache{ClientSessionCache: t.ClientSessionCache}
	t.ClientSessionCache = tickets
	c := &Client{
		cfg: cfg, tickets: tickets, log: log.With("component", "tunnel"),
		routes: listeners{self: cfg.Name, backlog: cfg.ListenBacklog},
		ready:  make(chan struct{}),
	}
	for i, addr := range append([]string{cfg.Addr}, cfg.Also...) {
		a := consoleAddr{addr: addr, tls: t.Clone()}
		if i > 0 || a.tls.ServerName == "" {
			a.tls.ServerName, _, _ = net.SplitHostPort(addr)
		}
		a.fullTLS = a.tls.Clone()
		a.fullTLS.ClientSessionCache = nil
		c.addrs = append(c.addrs, a)
	}
	c.next.Store(int32(rand.N(len(c.addrs))))
	return c, nil
}

// consoleAddr is one address of the console, with the TLS settings that
// dial it.
type consoleAddr struct {
	addr    string
	tls     *tls.Config
	fullTLS *tls.Config // tls without resumption
}

// addr returns the address to dial.
func (c *Client) addr() consoleAddr { return c.addrs[int(c.next.Load())%len(c.addrs)] }

// moveOn makes the next dial go to the next of the console's addresses.
func (c *Client) moveOn() {
	if len(c.addrs) > 1 {
		c.next.Store((c.next.Load() + 1) % int32(len(c.addrs)))
	}
}

// Listen returns the listener for streams of kind opened by the console.
// It keeps working across reconnects.
func (c *Client) Listen(kind Kind) *Listener { return c.routes.listen(kind) }

// Session returns the live session, or nil.
func (c *Client) Session() *Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// Open opens a stream of kind to the console, waiting for a session while
// ctx allows.
func (c *Client) Open(ctx context.Context, kind Kind, meta map[string]string) (net.Conn, error) {
	for {
		c.mu.Lock()
		sess, ready := c.current, c.ready
		c.mu.Unlock()
		if sess != nil {
			conn, err := sess.Open(ctx, kind, meta)
			if !errors.Is(err, ErrClosed) {
				return conn, err
			}
			// The session just ended; Run is about to clear it.
			select {
			case <-time.After(10 * time.Millisecond):
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("tunnel: waiting for the console: %w", ctx.Err())
			}
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("tunnel: waiting for the console: %w", ctx.Err())
		}
	}
}

// Run dials the console and keeps a session up until ctx is done. It
// returns only then, after closing every listener.
func (c *Client) Run(ctx context.Context) error {
	defer c.routes.closeAll()
	r := redial{backoff: c.cfg.Backoff, rejoin: c.cfg.Rejoin, hurry: c.Hurry}
	for {
		e, err := c.runOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if !e.up && c.OnDialError != nil {
			c.OnDialError(err)
		}
		r.rejoin = c.RejoinWindow()
		wait, why := r.next(e)
		level := slog.LevelWarn
		if e.goAway || e.busy > 0 {
			level = slog.LevelInfo
		}
		c.log.Log(ctx, level, "tunnel down, redialling", "err", err, "why", why,
			"in", wait.Round(time.Millisecond), "failures", r.fails)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// AdviseRejoin takes the window the console says its boxes should spread
// their return over (see redial): the console sizes it by the boxes it
// holds and the pace it greets them at. It is bounded by Backoff.Max,
// never shortens the box's own Rejoin, and 0 takes the advice back. Safe
// for concurrent use.
func (c *Client) AdviseRejoin(d time.Duration) {
	d = max(d, 0)
	was := time.Duration(c.advised.Swap(int64(d)))
	// Logged when it moves by a quarter or more, not at each small step
	// the fleet's size makes.
	if diff := d - was; diff != 0 && 4*max(diff, -diff) >= was {
		c.log.Info("the console advised how long to spread a return over", "window", d, "was", was,
			"taken", c.RejoinWindow())
	}
}

// RejoinWindow is the window a box redials within after a goodbye or a
// healthy session broke: its own, or the console's advice when that is
// longer and the box is in no hurry (Hurry).
func (c *Client) RejoinWindow() time.Duration {
	if c.Hurry != nil && c.Hurry() {
		return c.cfg.Rejoin
	}
	return max(c.cfg.Rejoin, min(time.Duration(c.advised.Load()), c.cfg.Backoff.Max))
}

// runOnce dials and serves one session until it ends; a renewal replaces
// it with a new one on the way. It says how the link ended, and why.
func (c *Client) runOnce(ctx context.Context) (ending, error) {
	sess, err := c.connect(ctx, false)
	if err != nil {
		var busy *BusyError
		if errors.As(err, &busy) {
			return ending{busy: max(busy.RetryAfter, time.Millisecond)}, err
		}
		return ending{}, err
	}
	started, healthy := sess.Started(), false
	c.mu.Lock()
	c.current = sess
	close(c.ready)
	c.mu.Unlock()
	if c.OnSession != nil {
		c.OnSession(sess, true)
	}

	for ended := false; !ended; {
		select {
		case <-sess.Done():
			ended = true
		case <-ctx.Done():
			ended = true
		case <-sess.renewDue:
			if next := c.renew(ctx, sess); next != nil {
				healthy = healthy || sess.healthy.Load()
				sess = next
			}
		}
	}
	sess.Close() // waits for the stream handlers: a goodbye is recorded

	c.mu.Lock()
	c.current = nil
	c.ready = make(chan struct{})
	c.mu.Unlock()
	if c.OnSession != nil {
		c.OnSession(sess, false)
	}
	e := ending{up: true, lasted: time.Since(started), healthy: healthy || sess.healthy.Load()}
	if reason, ok := sess.GoneAway(); ok {
		e.goAway = true
		return e, fmt.Errorf("session ended: the console said goodbye (%s)", reason)
	}
	return e, errors.New("session ended")
}

// renew dials a session to take old's place and returns it, or nil when
// old stays (the dial failed). The console drops old when the new session
// arrives; streams on old that a renewal may cut end with it. The
// handshake is a full one: a resumed session costs the console more for
// its life (the ticket, and a ClientHello that grew its buffers), and
// renewals are rare and spread out.
func (c *Client) renew(ctx context.Context, old *Session) *Session {
	next, err := c.connect(ctx, true)
	if err != nil {
		c.log.Info("renewing the tunnel session failed; keeping the old one", "err", err)
		return nil
	}
	c.mu.Lock()
	c.current = next
	c.mu.Unlock()
	old.Close()
	if c.OnSession != nil {
		c.OnSession(old, false)
		c.OnSession(next, true)
	}
	c.log.Info("tunnel session renewed", "carried_bytes", old.moved.Load())
	return next
}

// connect dials the console and starts a session; see dial for fresh.
func (c *Client) connect(ctx context.Context, fresh bool) (*Session, error) {
	m := c.cfg.Metrics
	conn, err := c.dial(ctx, fresh)
	if err != nil {
		var busy *BusyError
		switch {
		case ctx.Err() != nil: // stopping: not a failure of the link
		case errors.As(err, &busy):
			m.handshake("busy")
		default:
			m.handshake("failed")
		}
		return nil, err
	}
	hc := watchReads(yamuxConn(conn))
	ys, err := yamux.Client(hc, c.cfg.yamux())
	if err != nil {
		conn.Close()
		m.handshake("failed")
		return nil, err
	}
	sess := newSession(ys, c.cfg.Name, "console", c.cfg.Config, &c.routes, c.log, m)
	sess.hears(hc)
	sess.renewal = c.cfg.Renew
	sess.renewDue = make(chan struct{}, 1)
	sess.hearsGoodbye = true
	sess.onEnd = func() {
		conn.Close()
		m.sessionUp(-1)
	}
	m.sessionUp(1) // before anything can end it and count it down
	m.handshake("ok")
	sess.start()
	c.log.Info("tunnel up", "addr", conn.RemoteAddr().String(), "resumed", conn.ConnectionState().DidResume)
	return sess, nil
}

// ticketCache keeps the box's session tickets through a busy answer
// before TLS, and through a handshake the link broke off. crypto/tls
// forgets the ticket it offered when a handshake fails (a bad ticket must
// not be offered again, and the server says so with an alert); a console
// that said "come back later", or a handshake cut by a deadline while the
// console was busy, found nothing wrong with it, and the box's next dial
// should resume as cheaply as this one would have.
type ticketCache struct {
	tls.ClientSessionCache
	mu  sync.Mutex
	cur *earlyConn // the connection of the handshake in progress
}

func (t *ticketCache) dialing(c *earlyConn) {
	t.mu.Lock()
	t.cur = c
	t.mu.Unlock()
}

func (t *ticketCache) Put(key string, cs *tls.ClientSessionState) {
	t.mu.Lock()
	cur := t.cur
	t.mu.Unlock()
	if cs == nil && cur != nil && cur.keepsTicket() {
		return
	}
	t.ClientSessionCache.Put(key, cs)
}

// dial opens the TLS connection, through a proxy when one applies. With
// fresh, the handshake is a full one.
func (c *Client) dial(ctx context.Context, fresh bool) (*tls.Conn, error) {
	a := c.addr()
	conn, err := c.dialAddr(ctx, a, fresh)
	var busy *BusyError
	if err != nil && ctx.Err() == nil && !errors.As(err, &busy) {
		c.moveOn()
	}
	return conn, err
}

// dialAddr opens the TLS connection to one of the console's addresses.
func (c *Client) dialAddr(ctx context.Context, a consoleAddr, fresh bool) (*tls.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	addr := a.addr
	proxy, err := c.cfg.Proxy(&url.URL{Scheme: "https", Host: addr})
	if err != nil {
		return nil, fmt.Errorf("tunnel: choosing proxy: %w", err)
	}
	var raw net.Conn
	if proxy != nil {
		raw, err = DialProxy(ctx, c.cfg.Dial, c.cfg.ProxyRoots, proxy, c.cfg.ProxySource, addr)
	} else {
		raw, err = c.cfg.Dial(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("tunnel: dial %s: %w", addr, err)
	}
	cfg := a.tls
	if fresh {
		cfg = a.fullTLS
	}
	early := &earlyConn{Conn: raw}
	tc := tls.Client(CorkConn(early), cfg)
	c.tickets.dialing(early)
	err = tc.HandshakeContext(ctx)
	c.tickets.dialing(nil)
	if err != nil {
		raw.Close()
		if busy := early.Busy(); busy != nil {
			// Too busy to start the handshake: the console said when to
			// come back, before either side spent any crypto.
			return nil, fmt.Errorf("tunnel: console %s: %w", addr, busy)
		}
		return nil, fmt.Errorf("tunnel: TLS handshake with %s: %w", addr, err)
	}
	if tc.ConnectionState().NegotiatedProtocol != ALPN {
		tc.Close()
		return nil, fmt.Errorf("tunnel: %s does not speak %s", addr, ALPN)
	}
	// The console's first byte says whether it accepts this box; in TLS
	// 1.3 a refused client certificate also shows up here, as an alert.
	if d, ok := ctx.Deadline(); ok {
		tc.SetReadDeadline(d)
	}
	if err := readVerdict(tc); err != nil {
		tc.Close()
		return nil, fmt.Errorf("tunnel: console %s: %w", addr, err)
	}
	tc.SetReadDeadline(time.Time{})
	return tc, nil
}
