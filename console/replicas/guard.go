package replicas

import (
	"crypto/tls"
	"net"
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgebox/edgebox/console/port"
)

// GuardConfig bounds what the replica listener lets in before a caller
// has shown a replica certificate. Only replicas should reach that port,
// but if anyone else can, their connections must not take the console's
// files (which its boxes' port shares) nor lock the replicas out.
type GuardConfig struct {
	// Handshakes bounds the connections that have not finished their TLS
	// handshake, in all; PerAddr those from one address (an IPv6 /64
	// counts as one). A connection over either is closed at once.
	// Connections that finished it with a replica certificate count
	// against neither: the streams and calls they carry have bounds of
	// their own (StreamsConfig.MaxStreams).
	Handshakes, PerAddr int
	// Metrics, when set, registers the connections refused.
	Metrics prometheus.Registerer
}

// DefaultGuardConfig is the bounds the console's replica listener runs
// with. Each stream another replica opens to a box here is a connection
// of its own, so a replica starting fifty UKEY sessions at once starts
// fifty handshakes from one address: the bound per address leaves room
// for that, and the bound in all for a few replicas doing it at once.
func DefaultGuardConfig() GuardConfig { return GuardConfig{Handshakes: 512, PerAddr: 128} }

// Guard wraps ln, a listener of the replica port, in TLS with cfg (see
// ListenerTLS), and holds the connections still in their handshake to
// gc's bounds. The handshake itself runs where the connection is first
// read or written, as with tls.NewListener; the caller bounds its time
// (http.Server's ReadHeaderTimeout does).
func Guard(ln net.Listener, cfg *tls.Config, gc GuardConfig) net.Listener {
	g := &guard{Listener: ln, cfg: cfg, gc: gc, byAddr: map[netip.Addr]int{},
		refused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "edgebox", Subsystem: "console",
			Name: "replica_port_refused_total",
			Help: "Connections to the replica port closed at once: too many in their TLS handshake, in all or from one address."})}
	if gc.Metrics != nil {
		gc.Metrics.MustRegister(g.refused)
	}
	return g
}

type guard struct {
	net.Listener
	cfg     *tls.Config
	gc      GuardConfig
	refused prometheus.Counter

	mu      sync.Mutex
	pending int                // connections in their handshake
	byAddr  map[netip.Addr]int // of those, from each address
}

// Accept returns the next connection within bounds, as a *tls.Conn.
func (g *guard) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := port.SourceAddr(c)
		if !g.book(addr) {
			g.refused.Inc()
			c.Close()
			continue
		}
		var once sync.Once
		done := func() { once.Do(func() { g.unbook(addr) }) }
		cfg := g.cfg.Clone()
		verify := cfg.VerifyConnection
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if verify != nil {
				if err := verify(cs); err != nil {
					return err
				}
			}
			done() // a replica: no longer a stranger's to bound
			return nil
		}
		return tls.Server(&bookedConn{Conn: c, done: done}, cfg), nil
	}
}

func (g *guard) book(addr netip.Addr) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pending >= g.gc.Handshakes || g.byAddr[addr] >= g.gc.PerAddr {
		return false
	}
	g.pending++
	g.byAddr[addr]++
	return true
}

func (g *guard) unbook(addr netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending--
	if g.byAddr[addr]--; g.byAddr[addr] <= 0 {
		delete(g.byAddr, addr)
	}
}

// bookedConn gives back its place among those in their handshake when it
// closes, if its handshake has not already.
type bookedConn struct {
	net.Conn
	done func()
}

func (c *bookedConn) Close() error {
	c.done()
	return c.Conn.Close()
}
