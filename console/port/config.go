// Package port is the console's one public port: it accepts TCP
// connections, keeps the books that hold it open to boxes and operators
// under a flood (admission), completes each TLS handshake under a
// deadline, and hands the connection to the tunnel server or to the HTTP
// API by its ALPN protocol.
package port

import (
	"errors"
	"time"
)

// Config are the port's admission limits.
type Config struct {
	// HandshakeTimeout bounds a TLS handshake from accept to its end,
	// against slowloris clients.
	HandshakeTimeout time.Duration
	// HelloTimeout bounds the wait from accept to a complete ClientHello
	// (never longer than HandshakeTimeout). Until its ClientHello is in, a
	// connection holds no handshake slot. It runs while the console is
	// busy too: at 5 s a 2,000-box storm on two loaded cores lost 125
	// boxes' connections to it (docs/benchmarks.md), so it is 10 s.
	HelloTimeout time.Duration
	// MaxHandshakes bounds handshakes in progress from clients that do not
	// offer the tunnel protocol (operators, enrolling boxes, registry
	// clients); MaxBoxHandshakes those from clients that do. Neither kind
	// can take the other's slots; past them a ClientHello is refused.
	MaxHandshakes    int
	MaxBoxHandshakes int
	// MaxConnsPerAddr bounds the connections one source address (an IPv6
	// /64) holds open on the public port, box sessions aside, and
	// MaxHandshakesPerAddr its handshakes in progress.
	MaxConnsPerAddr      int
	MaxHandshakesPerAddr int
	// MaxIdle bounds connections that have not sent their ClientHello.
	// Past it, or past MaxConnsPerAddr for one address, the oldest such
	// connection is closed to make room for the new one.
	MaxIdle int
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		HandshakeTimeout: 10 * time.Second,
		HelloTimeout:     10 * time.Second,
		MaxHandshakes:    1024,
		MaxBoxHandshakes: 4096,
		// One address may be an office or a site's NAT with operators
		// and boxes behind it; boxes' sessions do not count.
		MaxConnsPerAddr:      256,
		MaxHandshakesPerAddr: 128,
		MaxIdle:              4096,
	}
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	var errs []error
	if c.HandshakeTimeout <= 0 || c.HelloTimeout <= 0 ||
		c.MaxHandshakes <= 0 || c.MaxBoxHandshakes <= 0 {
		errs = append(errs, errors.New("handshake limits must be positive"))
	}
	if c.MaxConnsPerAddr <= 0 || c.MaxHandshakesPerAddr <= 0 || c.MaxIdle <= 0 {
		errs = append(errs, errors.New("MaxConnsPerAddr, MaxHandshakesPerAddr and MaxIdle must be positive"))
	}
	return errors.Join(errs...)
}
