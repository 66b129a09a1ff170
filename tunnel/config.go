package tunnel

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/hashicorp/yamux"
)

// ALPN is the TLS application protocol that selects the tunnel on the
// console's one public port.
const ALPN = "edgebox-tunnel/1"

// Config holds the session settings both sides share. Build it with
// DefaultConfig and change what you must; Validate says what is wrong.
type Config struct {
	// StreamWindow is the most a stream may have in flight unacknowledged.
	// It must cover twice the bandwidth-delay product of the slowest link we
	// serve well: 20 Mbit/s × 80 ms (4G) is 200 KB and 100 Mbit/s × 100 ms
	// is 1.25 MB. yamux's 256 KiB default reached 58 % of the 4G link and
	// 14 % of the 100 Mbit/s one; 4 MiB reaches over 90 % of both (see
	// docs/benchmarks.md, BenchmarkLink). Windows grow only as data
	// arrives, so an idle stream costs nothing extra.
	StreamWindow uint32

	// PingInterval is how often each side sends an application ping. A
	// ping not answered within PingTimeout is late: it is counted and logged
	// at debug, and it ends nothing.
	//
	// DeadAfter is how long the link may stay silent while a ping is
	// outstanding: once nothing at all was read from it for that long (no
	// stream data, no window update, no ping or ping answer, late or not),
	// and the oldest unanswered ping went out at least PingTimeout ago, the
	// session is dead and closed. A slow far side whose answers come late
	// is not dead, and the session keeps pinging; only silence ends it.
	// DeadAfter is also yamux's write timeout, and how long one ping waits
	// for its answer: a write is never failed by a slow far side sooner
	// than the session would be declared dead.
	//
	// The arithmetic of the defaults (10 s, 10 s, 25 s): on a link that
	// answers, a ping is sent at most PingInterval after the last byte
	// read, so a half-open link is closed DeadAfter = 25 s after its last
	// byte, and the box, redialling within its 5 s rejoin window, is back
	// within 30 s (later when its console advised a longer window: see
	// Client.AdviseRejoin). A far side that is merely slow may answer a ping up to
	// DeadAfter - PingInterval = 15 s late even when nothing else arrives
	// (1.5 times the old 10 s bound; during the storm of 15,000 boxes on
	// one core, 11.7 % of the console's pings took 2.5 to 10 s), and any
	// later while anything else arrives, such as the far side's own pings.
	// Validate keeps DeadAfter >= PingInterval + PingTimeout, so pings
	// answered in time never end a session. Both sides ping: 2 small frames
	// each way every 10 s per box.
	PingInterval time.Duration
	PingTimeout  time.Duration
	DeadAfter    time.Duration

	// RTTEvery, when set, is for the side whose far side pings every
	// PingInterval: the console, as every box does. It pings only when it
	// has heard nothing for DeadAfter - PingTimeout (15 s by default: past
	// the box's own next ping), so a silent link is still closed DeadAfter
	// after its last byte; and, while it hears the box, once every
	// RTTEvery to keep its round-trip figure fresh. A ping of its own
	// costs the console a timer run, a frame out and its answer in: with
	// both sides pinging, an idle fleet's pings were most of an idle
	// console's CPU (docs/benchmarks.md). 0 pings every PingInterval.
	RTTEvery time.Duration

	// OpenTimeout bounds opening a stream: sending its header and reading
	// the far side's verdict, and on the accepting side reading the header.
	OpenTimeout time.Duration

	// AcceptBacklog bounds streams that arrived but were not yet taken by
	// the session; past it yamux resets new streams. ListenBacklog bounds
	// streams waiting in one Listener's Accept; past it they are refused
	// as busy once they have waited ListenWait for room, so a listener
	// whose server was briefly not scheduled (a burst of a thousand opens
	// on a loaded box) takes them all, and one that stopped accepting
	// answers in bounded time. PendingHeaders bounds streams whose header
	// is being read or that wait for room.
	AcceptBacklog  int
	ListenBacklog  int
	ListenWait     time.Duration
	PendingHeaders int
}

// DefaultConfig returns the settings edgebox ships with.
func DefaultConfig() Config {
	return Config{
		StreamWindow:   4 << 20,
		PingInterval:   10 * time.Second,
		PingTimeout:    10 * time.Second,
		DeadAfter:      25 * time.Second,
		OpenTimeout:    15 * time.Second,
		AcceptBacklog:  64,
		ListenBacklog:  128,
		ListenWait:     2 * time.Second,
		PendingHeaders: 256,
	}
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.StreamWindow < 256*1024 {
		errs = append(errs, fmt.Errorf("StreamWindow %d is below yamux's minimum of 256 KiB", c.StreamWindow))
	}
	if c.PingInterval <= 0 || c.PingTimeout <= 0 {
		errs = append(errs, errors.New("PingInterval and PingTimeout must be positive"))
	} else if c.DeadAfter < c.PingInterval+c.PingTimeout {
		errs = append(errs, fmt.Errorf("DeadAfter %v must be at least PingInterval + PingTimeout (%v), or a link that answers every ping in time could be declared dead",
			c.DeadAfter, c.PingInterval+c.PingTimeout))
	}
	if c.RTTEvery < 0 {
		errs = append(errs, errors.New("RTTEvery must not be negative"))
	}
	if c.OpenTimeout <= 0 {
		errs = append(errs, errors.New("OpenTimeout must be positive"))
	}
	if c.AcceptBacklog <= 0 || c.ListenBacklog <= 0 || c.PendingHeaders <= 0 {
		errs = append(errs, errors.New("AcceptBacklog, ListenBacklog and PendingHeaders must be positive"))
	}
	if c.ListenWait < 0 || c.ListenWait >= c.OpenTimeout {
		errs = append(errs, fmt.Errorf("ListenWait %v must be at least 0 and below OpenTimeout (%v), or the opener gives up before it hears busy", c.ListenWait, c.OpenTimeout))
	}
	return errors.Join(errs...)
}

// Renewal says when a box replaces its session with a fresh one. A session
// that carried bulk data keeps buffers sized for it on both sides for as
// long as it lives: crypto/tls's input buffer grows to the largest burst
// read, yamux's send buffer to the largest frame written, and the session's
// goroutines keep the stacks they grew. An idle box that once pulled an
// image cost the console three times what a fresh one does
// (docs/benchmarks.md, BenchmarkSessionCost). Once such a session has been
// quiet for Idle, the box dials a new one (resuming TLS) and the console
// replaces the old one with it, as it does for any reconnect.
type Renewal struct {
	// After is how many bytes a session's streams must have carried for it
	// to be renewed; 0 never renews.
	After int64
	// Idle is how long no stream may have carried anything; it is also
	// the least time between two attempts.
	Idle time.Duration
	// Cuts are the kinds whose open streams a renewal may end, because
	// their users open them again on the new session. An open stream of
	// any other kind (a shell, a screen, a USB key) holds the session.
	Cuts []Kind
}

// DefaultRenewal is what boxes run with: sessions that moved 1 MiB are
// renewed after two quiet minutes; the Sync stream, gRPC and registry
// connections are opened again by their users.
func DefaultRenewal() Renewal {
	return Renewal{After: 1 << 20, Idle: 2 * time.Minute, Cuts: []Kind{KindSync, KindRPC, KindRegistry}}
}

func (r Renewal) cuts(k Kind) bool { return slices.Contains(r.Cuts, k) }

func (c Config) yamux() *yamux.Config {
	return &yamux.Config{
		AcceptBacklog: c.AcceptBacklog,
		// Liveness is our own ping loop, which also records the RTT.
		EnableKeepAlive:   false,
		KeepAliveInterval: c.PingInterval,
		// yamux fails a write (a stream's data, window update or close, a
		// ping or a ping's answer) whose frame did not leave within this;
		// the session goes on. It ends the session only when its receive
		// loop cannot queue a frame (a reset for a stream past the accept
		// backlog, a protocol-error goaway) within it. Ping also waits this
		// long for its answer. Below DeadAfter it would fail the writes, and
		// the pings, of a live session whose far side is slow.
		ConnectionWriteTimeout: c.DeadAfter,
		MaxStreamWindowSize:    c.StreamWindow,
		StreamOpenTimeout:      c.OpenTimeout,
		StreamCloseTimeout:     5 * time.Minute,
		LogOutput:              io.Discard,
	}
}
