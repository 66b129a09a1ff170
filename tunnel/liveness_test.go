package tunnel

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgebox/edgebox/internal/test/toxic"
)

// livenessConfig pings every 100 ms, calls a ping late after 200 ms and a
// link dead after 3 s of silence: short enough for tests, with room for a
// slow machine between what is late and what is dead.
func livenessConfig() Config {
	cfg := DefaultConfig()
	cfg.PingInterval = 100 * time.Millisecond
	cfg.PingTimeout = 200 * time.Millisecond
	cfg.DeadAfter = 3 * time.Second
	return cfg
}

func TestValidateLiveness(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		mod          func(*Config)
		wantErr      string // "" for valid
		writeTimeout time.Duration
	}{
		{"defaults", func(*Config) {}, "", 25 * time.Second},
		{"dead exactly after one interval and timeout", func(c *Config) { c.DeadAfter = 20 * time.Second }, "", 20 * time.Second},
		{"short test settings", func(c *Config) { *c = livenessConfig() }, "", 3 * time.Second},
		{"dead before a ping answered in time", func(c *Config) { c.DeadAfter = 19 * time.Second }, "DeadAfter 19s must be at least PingInterval + PingTimeout (20s)", 0},
		{"no dead bound", func(c *Config) { c.DeadAfter = 0 }, "DeadAfter 0s must be at least", 0},
		{"negative dead bound", func(c *Config) { c.DeadAfter = -time.Second }, "DeadAfter -1s must be at least", 0},
		{"no ping timeout", func(c *Config) { c.PingTimeout = 0 }, "PingInterval and PingTimeout must be positive", 0},
		{"no ping interval", func(c *Config) { c.PingInterval = 0 }, "PingInterval and PingTimeout must be positive", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			tt.mod(&cfg)
			err := cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				// A slow far side's writes fail no sooner than its link is dead.
				if got := cfg.yamux().ConnectionWriteTimeout; got != tt.writeTimeout {
					t.Fatalf("yamux write timeout %v, want DeadAfter %v", got, tt.writeTimeout)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestSlowFarSideKeepsSession puts latency between a box and its console,
// so that every ping is answered later than PingTimeout: the sessions on
// both sides stay up as long as the link is silent for less than
// DeadAfter, and end when it is silent for longer.
func TestSlowFarSideKeepsSession(t *testing.T) {
	t.Parallel()
	cfg := livenessConfig()
	tests := []struct {
		name     string
		down, up time.Duration // latency console to box, box to console
		wantUp   bool
	}{
		{"the console answers late", 500 * time.Millisecond, 0, true},
		{"both answer late", 400 * time.Millisecond, 400 * time.Millisecond, true},
		{"the box answers late", 0, 500 * time.Millisecond, true},
		{"the console is slower than DeadAfter", 2 * cfg.DeadAfter, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newTestPKI(t)
			srv := startTestServer(t, p, cfg, "")
			px := toxic.New(t, srv.addr)
			cli := startTestClient(t, p, "box-1", px.Addr(), func(c *ClientConfig) { c.Config = cfg })
			waitFor(t, 10*time.Second, "a session", func() bool {
				_, ok := srv.Session("box-1")
				return ok && cli.Session() != nil
			})
			box := cli.Session()
			console, _ := srv.Session("box-1")
			for stream, d := range map[string]time.Duration{"downstream": tt.down, "upstream": tt.up} {
				if d == 0 {
					continue
				}
				if err := px.Add(stream, "latency", stream, fmt.Sprintf(`"latency": %d`, d.Milliseconds())); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			if !tt.wantUp {
				waitFor(t, cfg.DeadAfter+20*time.Second, "the box to drop its session", func() bool { return ended(box) })
				t.Logf("the box dropped the session %v after the link slowed", time.Since(start).Round(time.Millisecond))
				return
			}
			// Longer than DeadAfter: a session judged by its late pings alone
			// would have ended by now.
			hold := cfg.DeadAfter + 2*time.Second
			for time.Since(start) < hold {
				if ended(box) || ended(console) {
					t.Fatalf("a session ended %v after the link slowed (box ended: %v, console ended: %v)",
						time.Since(start).Round(time.Millisecond), ended(box), ended(console))
				}
				time.Sleep(20 * time.Millisecond)
			}
			if cli.Session() != box {
				t.Fatal("the box replaced its session")
			}
			if s, _ := srv.Session("box-1"); s != console {
				t.Fatal("the console replaced the box's session")
			}
			if late := count(srv.metrics.late); late == 0 {
				t.Fatal("the console counted no late ping")
			}
			if dead := count(srv.metrics.dead); dead != 0 {
				t.Fatalf("the console counted %v dead links", dead)
			}
			t.Logf("console: %v late pings, last RTT %v", count(srv.metrics.late), console.RTT())
		})
	}
}

// TestSilentLinkIsDead blackholes a link without closing it, in one
// direction or both: the side that hears nothing closes its session within
// DeadAfter of the link's last byte, and the other side follows.
func TestSilentLinkIsDead(t *testing.T) {
	t.Parallel()
	cfg := livenessConfig()
	tests := []struct {
		name           string
		streams        []string
		consoleNotices bool // the console is the side that hears nothing
	}{
		// Both sides hear nothing and both give up at DeadAfter: whichever
		// does first closes its connection, which the proxy passes on, so
		// the other may see the close before its own verdict.
		{"both ways", []string{"downstream", "upstream"}, false},
		{"console to box", []string{"downstream"}, false},
		{"box to console", []string{"upstream"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newTestPKI(t)
			consoleCfg := cfg
			consoleCfg.RTTEvery = time.Hour // as the console runs: it pings only when it hears nothing
			srv := startTestServer(t, p, consoleCfg, "")
			px := toxic.New(t, srv.addr)
			cli := startTestClient(t, p, "box-1", px.Addr(), func(c *ClientConfig) {
				c.Config = cfg
				c.Backoff = Backoff{Min: time.Second, Max: time.Minute}
			})
			waitFor(t, 10*time.Second, "a session", func() bool {
				_, ok := srv.Session("box-1")
				return ok && cli.Session() != nil
			})
			box := cli.Session()
			console, _ := srv.Session("box-1")
			for _, stream := range tt.streams {
				if err := px.Add(stream, "timeout", stream, `"timeout": 0`); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			// The bound is DeadAfter after the last byte, which came before
			// the blackhole; the rest is room for a slow machine.
			bound := cfg.DeadAfter + 10*time.Second
			waitFor(t, bound, "both sides to drop the session", func() bool { return ended(box) && ended(console) })
			t.Logf("both sides dropped the session %v after the link went silent (DeadAfter %v)",
				time.Since(start).Round(time.Millisecond), cfg.DeadAfter)
			if dead := count(srv.metrics.dead); tt.consoleNotices && dead == 0 {
				t.Fatal("the console counted no dead link")
			}
		})
	}
}

// TestAnyFrameIsLife runs a box session over the connection wrapper
// (watchReads) against a far side that never answers a ping but keeps
// sending frames (answers to pings given up long ago): the session stays
// up while they arrive, counts its pings late, keeps pinging, and is dead
// once they stop.
func TestAnyFrameIsLife(t *testing.T) {
	t.Parallel()
	cfg := livenessConfig()
	cfg.DeadAfter = 2 * time.Second
	tests := []struct {
		name    string
		talkFor time.Duration // how long the far side keeps sending
	}{
		{"silent from the start", 0},
		{"talks for three times DeadAfter", 3 * cfg.DeadAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newTestPKI(t)
			far := startMuteFarSide(t, p, 100*time.Millisecond)
			sess, m := startWatchedSession(t, p, cfg, far.addr)
			start := time.Now()
			for time.Since(start) < tt.talkFor {
				if ended(sess) {
					t.Fatalf("the session ended %v into a link that kept sending", time.Since(start).Round(time.Millisecond))
				}
				time.Sleep(20 * time.Millisecond)
			}
			if tt.talkFor > 0 {
				if late := count(m.late); late == 0 {
					t.Fatal("no late ping counted while the far side never answered")
				}
				if pings := far.pings(); pings < 2 {
					t.Fatalf("the session sent %d pings; it must keep pinging after one went unanswered", pings)
				}
				if silent := time.Since(sess.LastHeard()); silent > cfg.DeadAfter {
					t.Fatalf("LastHeard says the link was silent for %v while it kept sending", silent)
				}
			}
			far.mute()
			muted := time.Now()
			waitFor(t, cfg.DeadAfter+10*time.Second, "the session to be declared dead", func() bool { return ended(sess) })
			t.Logf("declared dead %v after the far side fell silent (DeadAfter %v)", time.Since(muted).Round(time.Millisecond), cfg.DeadAfter)
			if dead := count(m.dead); dead != 1 {
				t.Fatalf("%v dead links counted, want 1", dead)
			}
		})
	}
}

func ended(s *Session) bool {
	select {
	case <-s.Done():
		return true
	default:
		return false
	}
}

// muteFarSide is the console end of one tunnel connection, speaking yamux
// frames by hand: it reads and counts what the box sends, never answers a
// ping, and until mute sends, every period, an answer to a ping nobody
// waits for any more.
type muteFarSide struct {
	addr    string
	mu      sync.Mutex // guards seen
	seen    int        // pings read
	quiet   chan struct{}
	quietly sync.Once
}

func startMuteFarSide(t *testing.T, p *testPKI, period time.Duration) *muteFarSide {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &muteFarSide{addr: ln.Addr().String(), quiet: make(chan struct{})}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		raw, err := ln.Accept()
		if err != nil {
			return
		}
		c := tls.Server(raw, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.server}})
		defer c.Close()
		wg.Add(1)
		go func() { // reads until the connection closes
			defer wg.Done()
			f.read(c)
		}()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for id := uint32(1 << 31); ; id++ {
			select {
			case <-stop:
				return
			case <-f.quiet:
				<-stop
				return
			case <-tick.C:
			}
			var hdr [12]byte // version 0, type ping, flag ACK, stream 0, ping id
			hdr[1], hdr[3] = 2, 2
			binary.BigEndian.PutUint32(hdr[8:], id)
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(hdr[:]); err != nil {
				return
			}
		}
	}()
	return f
}

func (f *muteFarSide) read(c net.Conn) {
	var hdr [12]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		switch hdr[1] {
		case 0: // data: skip its body
			if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[8:]))); err != nil {
				return
			}
		case 2:
			if binary.BigEndian.Uint16(hdr[2:])&1 != 0 { // SYN: a ping to answer
				f.mu.Lock()
				f.seen++
				f.mu.Unlock()
			}
		}
	}
}

func (f *muteFarSide) pings() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen
}

func (f *muteFarSide) mute() { f.quietly.Do(func() { close(f.quiet) }) }

// startWatchedSession dials addr and runs a box session over it the way
// Client does, with the session judging the link by every read
// (watchReads).
func startWatchedSession(t *testing.T, p *testPKI, cfg Config, addr string) (*Session, *Metrics) {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(CorkConn(raw), &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.pool, ServerName: "127.0.0.1"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		t.Fatal(err)
	}
	hc := watchReads(yamuxConn(tc))
	ys, err := yamux.Client(hc, cfg.yamux())
	if err != nil {
		tc.Close()
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := NewMetrics(nil)
	sess := newSession(ys, "box", "console", cfg, &listeners{self: "box", backlog: cfg.ListenBacklog}, log, m)
	sess.hears(hc)
	sess.onEnd = func() { tc.Close() }
	sess.start()
	t.Cleanup(func() { sess.Close() })
	return sess, m
}

// count reads a counter.
func count(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestTheConsoleLeansOnTheBoxsPings runs a console whose box pings every
// 100 ms. With RTTEvery set, the console pings once to learn the round
// trip and then only every RTTEvery, however often the box pings; without
// it, it pings every PingInterval too.
func TestTheConsoleLeansOnTheBoxsPings(t *testing.T) {
	t.Parallel()
	const span = 3 * time.Second
	tests := []struct {
		name     string
		rttEvery time.Duration
		min, max float64 // the console's pings in span
	}{
		{"every PingInterval", 0, 15, 31},
		{"leaning on the box", time.Second, 2, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			box := livenessConfig()
			console := box
			console.RTTEvery = tt.rttEvery
			p := newTestPKI(t)
			srv := startTestServer(t, p, console, "")
			cli := startTestClient(t, p, "box-1", srv.addr, func(c *ClientConfig) { c.Config = box })
			waitFor(t, 10*time.Second, "a session", func() bool {
				_, ok := srv.Session("box-1")
				return ok && cli.Session() != nil
			})
			sess, _ := srv.Session("box-1")
			before := pingsObserved(t, srv.metrics)
			time.Sleep(span)
			pings := pingsObserved(t, srv.metrics) - before
			t.Logf("the console pinged %v times in %v", pings, span)
			if pings < tt.min || pings > tt.max {
				t.Fatalf("the console pinged %v times in %v, want %v to %v", pings, span, tt.min, tt.max)
			}
			if sess.RTT() == 0 {
				t.Fatal("the console knows no round trip")
			}
			if ended(sess) {
				t.Fatal("the session ended")
			}
		})
	}
}

// pingsObserved is how many round trips m has measured.
func pingsObserved(t *testing.T, m *Metrics) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.rtt.Write(&d); err != nil {
		t.Fatal(err)
	}
	return float64(d.GetHistogram().GetSampleCount())
}
