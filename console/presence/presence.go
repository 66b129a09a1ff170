// Package presence tracks which boxes have a live tunnel session and when
// each was last seen, writes the last-seen times to the fleet records, and
// tells the tunnel server which box a session's certificate names.
package presence

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/tunnel"
)

// FlushEvery is how often Run writes last-seen times to the fleet.
const FlushEvery = time.Minute

// Identify returns the tunnel server's Identify: it turns a verified box
// certificate into a box ID, refusing revoked and unknown boxes. It runs
// on every session handshake.
func Identify(f *fleet.Fleet) func(tls.ConnectionState) (string, error) {
	return func(cs tls.ConnectionState) (string, error) {
		if len(cs.PeerCertificates) == 0 {
			return "", errors.New("no box certificate")
		}
		id, err := pki.BoxID(cs.PeerCertificates[0])
		if err != nil {
			return "", err
		}
		if f.IsRevoked(id) {
			return "", fmt.Errorf("box %s is revoked; enroll it again with a new token", id)
		}
		return id, nil
	}
}

// Status is what is known of a box's presence right now.
type Status struct {
	// Online: a round trip through its session succeeded within the last
	// two ping intervals plus a ping timeout.
	Online bool
	// RTT is the session's last round trip; ConnectedAt when it began;
	// Address where its connection comes from.
	RTT         time.Duration
	ConnectedAt time.Time
	Address     string
	// LastSeen is the last successful round trip, or for a box without a
	// session, when its last session began or ended since the last flush
	// (older times are in its fleet record).
	LastSeen time.Time
	// Replica names the console replica that holds the session, when
	// the console runs as several; empty otherwise.
	Replica string
}

// Tracker follows the tunnel server's sessions. Its methods are safe for
// concurrent use.
type Tracker struct {
	srv   *tunnel.Server
	fleet *fleet.Fleet
	cfg   tunnel.Config
	log   *slog.Logger

	mu   sync.Mutex           // guards seen
	seen map[string]time.Time // last seen, not yet written to the fleet
}

// New returns a Tracker of srv's sessions, srv being configured with cfg,
// that writes last-seen times to f. It starts nothing.
func New(srv *tunnel.Server, f *fleet.Fleet, cfg tunnel.Config, log *slog.Logger) *Tracker {
	return &Tracker{srv: srv, fleet: f, cfg: cfg, log: log.With("component", "presence"), seen: make(map[string]time.Time)}
}

// OnSession notes that a box was seen when its session starts or ends;
// whether it is online comes from the tunnel itself. It is the tunnel
// server's OnSession, or part of it, and does not block.
func (p *Tracker) OnSession(ev tunnel.SessionEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen[ev.BoxID] = time.Now()
}

// Presence returns box id's status.
func (p *Tracker) Presence(id string) Status {
	s, ok := p.srv.Session(id)
	if !ok {
		p.mu.Lock()
		defer p.mu.Unlock()
		return Status{LastSeen: p.seen[id]}
	}
	// Anything the box sent says it is there, a late ping answer too; a
	// session silent for DeadAfter is about to be closed as dead.
	last := s.LastHeard()
	return Status{
		Online:      time.Since(last) < p.cfg.DeadAfter,
		RTT:         s.RTT(),
		ConnectedAt: s.Started(),
		Address:     addrString(s.RemoteAddr()),
		LastSeen:    last,
	}
}

// Online reports Presence(id).Online without building the rest: a look
// at every box, as a metrics scrape makes, needs no more.
func (p *Tracker) Online(id string) bool {
	s, ok := p.srv.Session(id)
	return ok && time.Since(s.LastHeard()) < p.cfg.DeadAfter
}

// Drop closes a box's session and all its streams at once, reporting
// whether there was one.
func (p *Tracker) Drop(id string) bool { return p.srv.Drop(id) }

// Run writes last-seen times to the fleet every FlushEvery until ctx ends,
// and returns nil then. The times of sessions that end after it returns
// are written by Flush.
func (p *Tracker) Run(ctx context.Context) error {
	t := time.NewTicker(FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			p.Flush(ctx)
		}
	}
}

// Flush writes the last-seen times of every box seen since the last
// flush. A failed write is logged; the next one writes newer times.
func (p *Tracker) Flush(ctx context.Context) {
	for _, s := range p.srv.Sessions() {
		p.mu.Lock()
		p.seen[s.Peer()] = s.LastHeard()
		p.mu.Unlock()
	}
	p.mu.Lock()
	batch := p.seen
	p.seen = make(map[string]time.Time)
	p.mu.Unlock()
	if err := p.fleet.RecordSeen(ctx, batch); err != nil {
		p.log.Warn("recording last-seen times", "err", err)
	}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}
