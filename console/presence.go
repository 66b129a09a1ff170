package console

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/httpapi"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/tunnel"
)

// identify turns a verified box certificate into a box ID, refusing
// revoked and unknown boxes. It runs on every session handshake.
func (c *Console) identify(cs tls.ConnectionState) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("no box certificate")
	}
	id, err := pki.BoxID(cs.PeerCertificates[0])
	if err != nil {
		return "", err
	}
	if c.fleet.IsRevoked(id) {
		return "", fmt.Errorf("box %s is revoked; enroll it again with a new token", id)
	}
	return id, nil
}

// presence tracks which boxes have a live session, and when each was last
// seen by a successful round trip. "Online" means a round trip succeeded
// within the last two ping intervals plus a ping timeout.
type presence struct {
	srv   *tunnel.Server
	fleet *fleet.Fleet
	cfg   tunnel.Config
	log   *slog.Logger

	mu   sync.Mutex           // guards seen
	seen map[string]time.Time // last seen, not yet written to the database
}

func newPresence(srv *tunnel.Server, f *fleet.Fleet, cfg tunnel.Config, log *slog.Logger) *presence {
	return &presence{srv: srv, fleet: f, cfg: cfg, log: log, seen: make(map[string]time.Time)}
}

// onSession notes that a box was seen when its session starts or ends;
// whether it is online comes from the tunnel itself.
func (p *presence) onSession(ev tunnel.SessionEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen[ev.BoxID] = time.Now()
}

// Presence implements httpapi.Sessions.
func (p *presence) Presence(id string) httpapi.Presence {
	s, ok := p.srv.Session(id)
	if !ok {
		p.mu.Lock()
		defer p.mu.Unlock()
		return httpapi.Presence{LastSeen: p.seen[id]}
	}
	last := s.LastRoundTrip()
	return httpapi.Presence{
		Online:      time.Since(last) < 2*p.cfg.PingInterval+p.cfg.PingTimeout,
		RTT:         s.RTT(),
		ConnectedAt: s.Started(),
		LastSeen:    last,
	}
}

// Drop implements httpapi.Sessions.
func (p *presence) Drop(id string) bool { return p.srv.Drop(id) }

// run writes last-seen times to the database once a minute.
func (p *presence) run(ctx context.Context) { every(ctx, time.Minute, p.flush) }

// flush writes the last-seen times of every box seen since the last flush.
func (p *presence) flush() {
	for _, s := range p.srv.Sessions() {
		p.mu.Lock()
		p.seen[s.Peer()] = s.LastRoundTrip()
		p.mu.Unlock()
	}
	p.mu.Lock()
	batch := p.seen
	p.seen = make(map[string]time.Time)
	p.mu.Unlock()
	if err := p.fleet.RecordSeen(batch); err != nil {
		p.log.Warn("recording last-seen times", "err", err)
	}
}
