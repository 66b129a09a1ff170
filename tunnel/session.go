package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// ErrClosed is returned by Open and Accept once a session or listener is
// closed.
var ErrClosed = errors.New("tunnel: closed")

// Addr names the far end of a stream: the peer (a box ID on the console,
// "console" on the box) and the stream's kind.
type Addr struct {
	Peer string
	Kind Kind
}

func (a Addr) Network() string { return "edgebox-tunnel" }
func (a Addr) String() string  { return a.Peer + "/" + string(a.Kind) }

// router finds the listener for a kind, or nil.
type router interface {
	listener(Kind) *Listener
}

// Session is one live tunnel: a yamux session over a TLS connection.
// It is safe for concurrent use. Its goroutines (accept loop, ping loop,
// one per stream whose header is being read) stop when the session closes;
// Close waits for them.
type Session struct {
	peer    string // the far side's identity
	self    string // ours, for LocalAddr
	ys      *yamux.Session
	cfg     Config
	routes  router
	log     *slog.Logger
	metrics *Metrics
	started time.Time

	rtt      atomic.Int64 // last ping round trip in ns
	lastTrip atomic.Int64 // unix ns of the last successful round trip
	// heard is when the link last delivered anything: every read of the
	// connection when the session runs over watchReads, else ping answers.
	heard *readClock
	// unanswered is the monotonic time (see monoNow) the oldest ping not
	// yet answered went out, 0 when every ping was answered. A ping that
	// gave up without an answer leaves it set: the next one continues the
	// run.
	unanswered atomic.Int64
	// healthy is set once a round trip succeeded after the handshake: a
	// ping was answered, or a stream we opened was accepted.
	healthy atomic.Bool
	// goAway holds the far side's goodbye (its reason) once it said it is
	// going away; see Server.Close.
	goAway atomic.Pointer[string]
	// hearsGoodbye is set on the box side, the only one told goodbye.
	hearsGoodbye bool

	// What renewal goes by (client side; see Renewal).
	renewal  Renewal
	renewDue chan struct{} // signalled when the session should be renewed
	moved    atomic.Int64  // bytes read and written on streams
	lastIO   atomic.Int64  // unix ns of the last stream read or write
	pinned   atomic.Int32  // open streams a renewal must not cut
	triedAt  atomic.Int64  // unix ns of the last renewal asked for

	closeOnce sync.Once
	done      chan struct{} // closed when the session is closed
	// wg counts the accept loop, stream header readers and each armed
	// timer: ping and dead check (from arming until its function returns,
	// or until Close stops it).
	wg sync.WaitGroup

	mu        sync.Mutex // guards arming pingTimer and deadTimer against Close
	pingTimer *time.Timer
	// deadTimer runs deadCheck; it is armed while a ping is unanswered.
	deadTimer *time.Timer
	onEnd     func() // set before start; runs once, after the session ended

	// streams are the session's streams in use, nil once it is closed.
	// yamux (v0.1.2) leaves a stream's state as it was when its session
	// shuts down until its own Close has closed the connection, which
	// can take seconds, and a read or write waiting on such a stream
	// spins a core meanwhile: it finds the shutdown channel closed, the
	// stream still open, and waits again at once. So Close expires every
	// stream first, and no deadline set afterwards lifts that.
	streamsMu sync.Mutex
	streams   map[*yamux.Stream]struct{}
}

// expired is the deadline of a stream that must end now.
var expired = time.Unix(1, 0)

func newSession(ys *yamux.Session, self, peer string, cfg Config, routes router, log *slog.Logger, m *Metrics) *Session {
	s := &Session{
		peer: peer, self: self, ys: ys, cfg: cfg, routes: routes,
		log: log, metrics: m, started: time.Now(),
		done:    make(chan struct{}),
		heard:   newReadClock(),
		streams: make(map[*yamux.Stream]struct{}),
	}
	s.lastTrip.Store(s.started.UnixNano()) // the handshake was a round trip
	s.lastIO.Store(s.started.UnixNano())
	return s
}

// count records bytes moved on one of the session's streams; what
// renewal goes by only on sessions that renew.
func (s *Session) count(read, written int) {
	n := read + written
	if n == 0 {
		return
	}
	if s.renewDue != nil {
		s.moved.Add(int64(n))
		s.lastIO.Store(time.Now().UnixNano())
	}
	s.metrics.countBytes(read, written)
}

// renewable reports whether the session carried enough to be worth
// replacing, has been quiet for long enough, holds no stream a renewal
// would cut, and was not asked to renew within the last quiet period.
func (s *Session) renewable(now time.Time) bool {
	r := s.renewal
	if r.After <= 0 || s.moved.Load() < r.After || s.pinned.Load() > 0 {
		return false
	}
	quiet := now.Sub(time.Unix(0, s.lastIO.Load()))
	tried := now.Sub(time.Unix(0, s.triedAt.Load()))
	return quiet >= r.Idle && tried >= r.Idle
}

// start runs the session: one goroutine accepts streams; pings run from a
// timer, so between pings they hold no goroutine. With yamux's own two,
// that is three goroutines per idle box on the console.
func (s *Session) start() {
	// Under s.mu, as Close marks the session done: a session closed
	// before it started (a console closing as the box arrives) starts
	// nothing, and one that started is waited for.
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
		return
	default:
	}
	s.wg.Add(2) // the accept loop, and the armed ping timer
	go func() {
		defer s.wg.Done()
		s.acceptLoop()
		go s.Close() // yamux ended on its own: the connection broke
	}()
	s.pingTimer = time.AfterFunc(s.cfg.PingInterval, s.pingTick)
}

// Peer returns the verified identity of the far side.
func (s *Session) Peer() string { return s.peer }

// RemoteAddr is the address the peer's connection comes from, as this
// side sees it (behind a NAT, the NAT's).
func (s *Session) RemoteAddr() net.Addr { return s.ys.RemoteAddr() }

// Started returns when the session came up.
func (s *Session) Started() time.Time { return s.started }

// RTT returns the round trip of the last successful ping, 0 before one.
func (s *Session) RTT() time.Duration { return time.Duration(s.rtt.Load()) }

// LastRoundTrip returns when a round trip over this session last
// succeeded: the handshake or a ping.
func (s *Session) LastRoundTrip() time.Time { return time.Unix(0, s.lastTrip.Load()) }

// LastHeard returns when the link last delivered anything: stream data, a
// window update, a ping or a ping's answer, late or not. A slow far side
// is heard from even while its answers to pings are late.
func (s *Session) LastHeard() time.Time {
	return time.Now().Add(-s.heard.silence(monoNow()))
}

// NumStreams returns the number of open streams.
func (s *Session) NumStreams() int { return s.ys.NumStreams() }

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// Ping sends one application ping and waits for its answer, at most
// Config.DeadAfter.
func (s *Session) Ping() (time.Duration, error) {
	rtt, err := s.ys.Ping()
	if err != nil {
		return 0, fmt.Errorf("tunnel: ping %s: %w", s.peer, err)
	}
	s.heard.mark()
	s.rtt.Store(int64(rtt))
	s.lastTrip.Store(time.Now().UnixNano())
	s.healthy.Store(true)
	s.metrics.observeRTT(rtt)
	return rtt, nil
}

// Close ends the session and every stream on it, and waits for the
// session's goroutines. It is idempotent.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		close(s.done)
		for _, t := range []*time.Timer{s.pingTimer, s.deadTimer} {
			if t != nil && t.Stop() {
				s.wg.Done() // the timer will not fire: its function never runs
			}
		}
		s.mu.Unlock()
		s.expireStreams()
		s.ys.Close()
		s.wg.Wait()
		if s.onEnd != nil {
			s.onEnd()
		}
	})
	s.wg.Wait()
	return nil
}

// track counts st among the streams in use; on a closed session it
// expires st instead.
func (s *Session) track(st *yamux.Stream) {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.streams == nil {
		st.SetDeadline(expired)
		return
	}
	s.streams[st] = struct{}{}
}

// untrack forgets st: it is closed.
func (s *Session) untrack(st *yamux.Stream) {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	delete(s.streams, st)
}

// setDeadline sets a deadline of a stream of the session with set; once
// the session is closed, the deadline stays expired.
func (s *Session) setDeadline(set func(time.Time) error, t time.Time) error {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.streams == nil {
		t = expired
	}
	return set(t)
}

// expireStreams ends every read and write waiting on the session's
// streams, and every one to come.
func (s *Session) expireStreams() {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	for st := range s.streams {
		st.SetDeadline(expired)
	}
	s.streams = nil
}

// pingTick runs from the ping timer: one ping, then the timer is armed
// again. A ping answered late, or not at all while the link still shows
// life, ends nothing: the next ping follows at once when this one got no
// answer. Whether the link is dead is deadCheck's to say.
func (s *Session) pingTick() {
	defer s.wg.Done()
	if wait := s.pingNotNeeded(); wait > 0 {
		s.armPing(wait)
		return
	}
	s.unanswered.CompareAndSwap(0, monoNow())
	s.armDeadCheck(s.deadDue())
	rtt, err := s.Ping()
	select {
	case <-s.done:
		return
	default:
	}
	next := s.cfg.PingInterval
	switch {
	case err == nil:
		s.unanswered.Store(0)
		s.disarmDeadCheck()
		if rtt > s.cfg.PingTimeout {
			s.metrics.pingLate()
			s.log.Debug("ping answered late", "peer", s.peer, "rtt", rtt.Round(time.Millisecond))
		}
	case errors.Is(err, yamux.ErrSessionShutdown):
		return // the connection broke; the accept loop closes the session
	case s.deadDue() <= 0:
		// Silent all along: deadCheck, armed for now, is closing the
		// session. Should something arrive first, it keeps pinging.
		next = 0
	default:
		// No answer within DeadAfter (or the ping could not leave), yet
		// the link is alive: something else arrived.
		s.metrics.pingLate()
		s.log.Debug("ping not answered, but the link is alive; pinging again", "peer", s.peer,
			"err", err, "silent_for", s.heard.silence(monoNow()).Round(time.Millisecond))
		next = 0
	}
	if now := time.Now(); err == nil && s.renewDue != nil && s.renewable(now) {
		s.triedAt.Store(now.UnixNano())
		select {
		case s.renewDue <- struct{}{}:
		default:
		}
	}
	s.armPing(next)
}

// pingNotNeeded returns how long this side may wait before it pings, when
// Config.RTTEvery lets it lean on the far side's pings and they show the
// link alive; 0 when it should ping now. A side that has no round trip yet,
// or whose last ping went unanswered, pings.
func (s *Session) pingNotNeeded() time.Duration {
	if s.cfg.RTTEvery <= 0 || s.rtt.Load() == 0 || s.unanswered.Load() != 0 {
		return 0
	}
	quiet := s.heard.silence(monoNow())
	measured := time.Since(time.Unix(0, s.lastTrip.Load()))
	return min(s.quietLimit()-quiet, s.cfg.RTTEvery-measured)
}

// quietLimit is how long a side leaning on the far side's pings waits
// for a byte before it pings: the latest that still closes a silent link
// DeadAfter after its last byte, and never less than PingInterval.
func (s *Session) quietLimit() time.Duration {
	return max(s.cfg.DeadAfter-s.cfg.PingTimeout, s.cfg.PingInterval)
}

// armPing arms the ping timer to fire in d, unless the session is closed.
func (s *Session) armPing(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
		return
	default:
	}
	s.wg.Add(1)
	s.pingTimer.Reset(d)
}

// deadDue returns how long until the link, if it stays silent, is dead:
// DeadAfter after its last byte, and no sooner than PingTimeout after the
// oldest unanswered ping went out (a ping sent late, by a starved
// process, still gets its time). It is 0 or less once that has passed.
func (s *Session) deadDue() time.Duration {
	now := monoNow()
	due := s.heard.last.Load() + int64(s.cfg.DeadAfter)
	if since := s.unanswered.Load(); since != 0 {
		due = max(due, since+int64(s.cfg.PingTimeout))
	}
	return time.Duration(due - now)
}

// deadCheck runs from the dead timer while a ping is unanswered: it closes
// the session when the link has been silent for DeadAfter, or looks again
// when that would be.
func (s *Session) deadCheck() {
	defer s.wg.Done()
	select {
	case <-s.done:
		return
	default:
	}
	since := s.unanswered.Load()
	if since == 0 {
		return // answered meanwhile
	}
	if due := s.deadDue(); due > 0 {
		s.armDeadCheck(due)
		return
	}
	now := monoNow()
	silent, unanswered := s.heard.silence(now), time.Duration(now-since)
	s.metrics.linkDead()
	s.log.Warn("link dead, closing session", "peer", s.peer,
		"silent_for", silent.Round(time.Millisecond), "ping_unanswered_for", unanswered.Round(time.Millisecond))
	go s.Close() // Close waits for this check
}

// armDeadCheck (re)arms the dead timer to fire in d, unless the session
// is closed.
func (s *Session) armDeadCheck(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
		return
	default:
	}
	if s.deadTimer == nil {
		s.wg.Add(1)
		s.deadTimer = time.AfterFunc(d, s.deadCheck)
		return
	}
	if !s.deadTimer.Reset(d) {
		s.wg.Add(1) // it had fired or was stopped: a new run is pending
	}
}

// disarmDeadCheck stops the dead timer, once every ping was answered.
func (s *Session) disarmDeadCheck() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deadTimer != nil && s.deadTimer.Stop() {
		s.wg.Done()
	}
}

// monoBase anchors monoNow: readings of the monotonic clock, so that a
// box whose wall clock is stepped (NTP, an RTC that was wrong) neither
// drops a live session nor keeps a dead one.
var monoBase = time.Now()

// monoNow returns nanoseconds on the monotonic clock, always above 0.
func monoNow() int64 { return int64(time.Since(monoBase)) + 1 }

// readClock records when a connection last delivered bytes.
type readClock struct {
	last atomic.Int64 // monoNow of the last read that returned bytes
}

func newReadClock() *readClock {
	c := &readClock{}
	c.mark()
	return c
}

func (c *readClock) mark() { c.last.Store(monoNow()) }

// silence returns how long before now (a monoNow reading) the last bytes
// arrived.
func (c *readClock) silence(now int64) time.Duration {
	return time.Duration(now - c.last.Load())
}

// heardConn is the connection a session's yamux reads from, with a clock
// of its last read: whatever frame arrives, the link is alive.
type heardConn struct {
	net.Conn
	clock *readClock
}

// watchReads wraps the connection handed to yamux so that the session
// knows when the link last delivered anything; give the result to the
// session with Session.hears. A read costs one clock reading more.
func watchReads(c net.Conn) *heardConn {
	return &heardConn{Conn: c, clock: newReadClock()}
}

func (c *heardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.clock.mark()
	}
	return n, err
}

// hears makes the session judge the link by every read of c, the
// connection its yamux reads from; call it before start. Without it only
// ping answers count as life.
func (s *Session) hears(c *heardConn) { s.heard = c.clock }

func (s *Session) acceptLoop() {
	sem := make(chan struct{}, s.cfg.PendingHeaders)
	for {
		st, err := s.ys.AcceptStream()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		case <-s.done:
			st.Close()
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			s.handleStream(st)
		}()
	}
}

func (s *Session) handleStream(st *yamux.Stream) {
	s.track(st)
	s.setDeadline(st.SetReadDeadline, time.Now().Add(s.cfg.OpenTimeout))
	h, err := ReadHeader(st)
	if err != nil {
		s.log.Debug("dropping stream with bad header", "peer", s.peer, "err", err)
		s.untrack(st)
		st.Close()
		return
	}
	s.setDeadline(st.SetReadDeadline, time.Time{})
	if h.Kind == kindGoAway && s.hearsGoodbye {
		s.heardGoodbye(st, h)
		return
	}
	c := s.newConn(st, h)
	l := s.routes.listener(h.Kind)
	if l == nil {
		s.refuse(c, fmt.Sprintf("no service for stream kind %q here", h.Kind))
		return
	}
	if !l.reserve(s.cfg.ListenWait, s.done) {
		s.refuse(c, fmt.Sprintf("service for stream kind %q is busy", h.Kind))
		return
	}
	s.setDeadline(st.SetWriteDeadline, time.Now().Add(s.cfg.OpenTimeout))
	if err := writeVerdict(st, ""); err != nil {
		l.unreserve()
		c.Close()
		return
	}
	s.setDeadline(st.SetWriteDeadline, time.Time{})
	s.metrics.streamOpened(h.Kind, "in")
	l.deliver(c)
}

func (s *Session) refuse(c *Conn, why string) {
	s.metrics.streamRefused(c.header.Kind)
	c.SetWriteDeadline(time.Now().Add(s.cfg.OpenTimeout))
	writeVerdict(c.st, why)
	c.Close()
}

func (s *Session) newConn(st *yamux.Stream, h Header) *Conn {
	c := &Conn{
		st: st, session: s, header: h,
		local:  Addr{Peer: s.self, Kind: h.Kind},
		remote: Addr{Peer: s.peer, Kind: h.Kind},
		pins:   s.renewDue != nil && !s.renewal.cuts(h.Kind),
	}
	if c.pins {
		s.pinned.Add(1)
	}
	return c
}

// Open opens a stream of the given kind to the far side and waits for its
// verdict. It fails with ErrRefused when the far side has no listener for
// the kind or is too busy, and obeys ctx until the stream is open.
func (s *Session) Open(ctx context.Context, kind Kind, meta map[string]string) (*Conn, error) {
	hb, err := Header{Kind: kind, Meta: meta}.MarshalBinary()
	if err != nil {
		return nil, err
	}
	select {
	case <-s.done:
		return nil, ErrClosed
	default:
	}
	st, err := s.ys.OpenStream()
	if err != nil {
		if errors.Is(err, yamux.ErrSessionShutdown) {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("tunnel: open %s stream to %s: %w", kind, s.peer, err)
	}
	s.track(st)
	deadline := time.Now().Add(s.cfg.OpenTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	s.setDeadline(st.SetDeadline, deadline)
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(expired) })
	_, err = st.Write(hb)
	if err == nil {
		err = readVerdict(st)
	}
	stopped := stop()
	if err != nil {
		s.untrack(st)
		st.Close()
		if !stopped || ctx.Err() != nil {
			return nil, fmt.Errorf("tunnel: open %s stream to %s: %w", kind, s.peer, ctx.Err())
		}
		return nil, fmt.Errorf("tunnel: open %s stream to %s: %w", kind, s.peer, err)
	}
	s.setDeadline(st.SetDeadline, time.Time{})
	s.healthy.Store(true)
	s.metrics.streamOpened(kind, "out")
	return s.newConn(st, Header{Kind: kind, Meta: meta}), nil
}
