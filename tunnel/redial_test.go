package tunnel

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// The endings the redial decision sees.
var (
	dialFailed = ending{}
	goodbye    = ending{up: true, lasted: 10 * time.Second, healthy: true, goAway: true}
	brokeShort = ending{up: true, lasted: 10 * time.Second, healthy: true}
	shed       = ending{up: true, lasted: 100 * time.Millisecond}
	longLife   = ending{up: true, lasted: 2 * time.Hour, healthy: true}
	longQuiet  = ending{up: true, lasted: 61 * time.Second} // no round trip seen, but long
	busy3s     = ending{busy: 3 * time.Second}
)

func TestRedialDecision(t *testing.T) {
	t.Parallel()
	s := time.Second
	tests := []struct {
		name  string
		seq   []ending
		ceils []time.Duration // the window each wait is drawn from
	}{
		{"failed dials back off from 1 s, doubling, to 60 s",
			[]ending{dialFailed, dialFailed, dialFailed, dialFailed, dialFailed, dialFailed, dialFailed, dialFailed},
			[]time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 60 * s, 60 * s}},
		{"a goodbye forgets the failures before it",
			[]ending{dialFailed, dialFailed, dialFailed, dialFailed, dialFailed, goodbye, dialFailed, dialFailed},
			[]time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 16 * s, 5 * s, 1 * s, 2 * s}},
		{"a healthy short session forgets the failures before it",
			[]ending{dialFailed, dialFailed, dialFailed, dialFailed, dialFailed, dialFailed, brokeShort, dialFailed},
			[]time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 5 * s, 1 * s}},
		{"three console restarts close together, each with a goodbye",
			[]ending{goodbye, dialFailed, goodbye, dialFailed, dialFailed, goodbye, dialFailed},
			[]time.Duration{5 * s, 1 * s, 5 * s, 1 * s, 2 * s, 5 * s, 1 * s}},
		{"three console crashes close together (no goodbye) after healthy sessions",
			[]ending{brokeShort, dialFailed, dialFailed, brokeShort, dialFailed, brokeShort, dialFailed},
			[]time.Duration{5 * s, 1 * s, 2 * s, 5 * s, 1 * s, 5 * s, 1 * s}},
		{"sessions shed before any round trip still back off",
			[]ending{dialFailed, shed, shed, shed, dialFailed, shed},
			[]time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s}},
		{"flapping sessions back off after three quick redials",
			[]ending{brokeShort, brokeShort, brokeShort, brokeShort, brokeShort, brokeShort, brokeShort, brokeShort},
			[]time.Duration{5 * s, 5 * s, 5 * s, 10 * s, 20 * s, 40 * s, 60 * s, 60 * s}},
		{"a long session ends the flapping",
			[]ending{brokeShort, brokeShort, brokeShort, brokeShort, longLife, brokeShort},
			[]time.Duration{5 * s, 5 * s, 5 * s, 10 * s, 5 * s, 5 * s}},
		{"a goodbye ends the flapping",
			[]ending{brokeShort, brokeShort, brokeShort, brokeShort, brokeShort, goodbye, brokeShort},
			[]time.Duration{5 * s, 5 * s, 5 * s, 10 * s, 20 * s, 5 * s, 5 * s}},
		{"a busy console's come-back time is kept, and counts as no failure",
			[]ending{dialFailed, dialFailed, busy3s, busy3s, dialFailed, brokeShort, busy3s, brokeShort},
			[]time.Duration{1 * s, 2 * s, 3 * s, 3 * s, 4 * s, 5 * s, 3 * s, 5 * s}},
		{"a session longer than Backoff.Max counts as a working console",
			[]ending{dialFailed, dialFailed, dialFailed, dialFailed, longQuiet, dialFailed},
			[]time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 5 * s, 1 * s}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var asked int64
			r := redial{
				backoff: Backoff{Min: time.Second, Max: time.Minute, Rand: func(n int64) int64 { asked = n; return n - 1 }},
				rejoin:  DefaultRejoin,
			}
			for i, e := range tt.seq {
				asked = 0
				wait, why := r.next(e)
				if e.busy > 0 { // the console's time, already spread by it
					if wait != tt.ceils[i] || asked != 0 {
						t.Fatalf("step %d (%+v, %s): wait %v (jitter drawn: %t), want the console's %v", i, e, why, wait, asked != 0, tt.ceils[i])
					}
					continue
				}
				// Full jitter: the wait is drawn uniformly from [0, ceil].
				if got := time.Duration(asked - 1); got != tt.ceils[i] || wait != tt.ceils[i] {
					t.Fatalf("step %d (%+v, %s): window [0, %v], want [0, %v]", i, e, why, got, tt.ceils[i])
				}
			}
		})
	}
}

// TestRedialHurries: while something waits on the link, failed dials
// wait at most Backoff.Min, however many failed before; a busy console's
// time is kept; once nothing waits, the backoff goes on from the
// failures so far.
func TestRedialHurries(t *testing.T) {
	t.Parallel()
	s := time.Second
	hurry := true
	r := redial{backoff: Backoff{Min: s, Max: time.Minute, Rand: func(n int64) int64 { return n - 1 }},
		rejoin: DefaultRejoin, hurry: func() bool { return hurry }}
	steps := []struct {
		e     ending
		hurry bool
		want  time.Duration
	}{
		{brokeShort, true, 5 * s},
		{dialFailed, true, 1 * s},
		{dialFailed, true, 1 * s},
		{dialFailed, true, 1 * s},
		{dialFailed, true, 1 * s},
		{busy3s, true, 3 * s},
		{dialFailed, false, 16 * s},
		{dialFailed, true, 1 * s},
	}
	for i, st := range steps {
		hurry = st.hurry
		if wait, why := r.next(st.e); wait != st.want {
			t.Fatalf("step %d (%+v, hurry %t): wait %v (%s), want %v", i, st.e, st.hurry, wait, why, st.want)
		}
	}
}

// TestRedialSpreadsAFleet checks the waits really are spread over their
// window: 1,000 boxes told goodbye at once come back over the whole rejoin
// window, not in one instant.
func TestRedialSpreadsAFleet(t *testing.T) {
	t.Parallel()
	const boxes = 1000
	buckets := make([]int, 5) // one a second of the 5 s window
	for range boxes {
		r := redial{backoff: Backoff{Min: time.Second, Max: time.Minute}, rejoin: DefaultRejoin}
		wait, _ := r.next(goodbye)
		if wait < 0 || wait > DefaultRejoin {
			t.Fatalf("wait %v outside [0, %v]", wait, DefaultRejoin)
		}
		buckets[min(int(wait/time.Second), len(buckets)-1)]++
	}
	for i, n := range buckets {
		// 200 expected in each; below 100 would be a chance of about 1e-14.
		if n < 100 {
			t.Errorf("second %d of the window got %d of %d boxes: %v", i, n, boxes, buckets)
		}
	}
}

func TestClientRejoinWindow(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	tests := []struct {
		backoff Backoff
		rejoin  time.Duration
		want    time.Duration
		wantErr bool
	}{
		{Backoff{}, 0, DefaultRejoin, false},
		{Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}, 0, 500 * time.Millisecond, false},
		{Backoff{Min: time.Second, Max: time.Minute}, 2 * time.Second, 2 * time.Second, false},
		{Backoff{Min: time.Second, Max: time.Minute}, 2 * time.Minute, 0, true},
		{Backoff{Min: time.Second, Max: time.Minute}, -time.Second, 0, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v-%v", tt.backoff.Max, tt.rejoin), func(t *testing.T) {
			t.Parallel()
			c, err := NewClient(ClientConfig{Config: DefaultConfig(), Addr: "127.0.0.1:1",
				TLS: &tls.Config{RootCAs: p.pool}, Backoff: tt.backoff, Rejoin: tt.rejoin}, testLogger(t))
			if tt.wantErr {
				if err == nil {
					t.Fatal("accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.cfg.Rejoin != tt.want {
				t.Fatalf("Rejoin %v, want %v", c.cfg.Rejoin, tt.want)
			}
		})
	}
}

// TestTheConsolesRejoinAdviceLengthensTheWindow: the window the console
// advises is taken when it is longer than the box's own, up to
// Backoff.Max, and 0 takes it back.
func TestTheConsolesRejoinAdviceLengthensTheWindow(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	c, err := NewClient(ClientConfig{Config: DefaultConfig(), Addr: "127.0.0.1:1", TLS: &tls.Config{RootCAs: p.pool}}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ advised, want time.Duration }{
		{0, DefaultRejoin},
		{20 * time.Second, 20 * time.Second},
		{time.Second, DefaultRejoin},
		{time.Hour, time.Minute},
		{-time.Second, DefaultRejoin},
		{0, DefaultRejoin},
	} {
		c.AdviseRejoin(tt.advised)
		if got := c.RejoinWindow(); got != tt.want {
			t.Fatalf("advised %v: window %v, want %v", tt.advised, got, tt.want)
		}
	}
	// A box in a hurry (a UKEY in use across boxes) keeps its own.
	c.AdviseRejoin(30 * time.Second)
	hurry := true
	c.Hurry = func() bool { return hurry }
	if got := c.RejoinWindow(); got != DefaultRejoin {
		t.Fatalf("in a hurry, advised 30s: window %v, want its own %v", got, DefaultRejoin)
	}
	hurry = false
	if got := c.RejoinWindow(); got != 30*time.Second {
		t.Fatalf("no longer in a hurry, advised 30s: window %v", got)
	}
}

// TestAClientTriesTheConsolesOtherAddresses gives a box three addresses of
// its console: one where nothing listens and two replicas. It comes up on
// a replica whichever it starts at, and when that replica stops, it comes
// up on the other.
func TestAClientTriesTheConsolesOtherAddresses(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	a := startTestServer(t, p, DefaultConfig(), "")
	b := startTestServer(t, p, DefaultConfig(), "")
	cli := startTestClient(t, p, "box-1", deadAddr, func(c *ClientConfig) { c.Also = []string{a.addr, b.addr} })
	on := func() *testServer {
		for _, s := range []*testServer{a, b} {
			if _, ok := s.Session("box-1"); ok && cli.Session() != nil {
				return s
			}
		}
		return nil
	}
	waitFor(t, 10*time.Second, "a session on a replica", func() bool { return on() != nil })
	first := on()
	other := a
	if first == a {
		other = b
	}
	first.stop()
	waitFor(t, 10*time.Second, "a session on the other replica", func() bool { return on() == other })
}

func TestClientConfigRefusesABadOtherAddress(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	_, err := NewClient(ClientConfig{Config: DefaultConfig(), Addr: "console:8443", Also: []string{"replica-b"},
		TLS: &tls.Config{RootCAs: p.pool}}, testLogger(t))
	if err == nil || !strings.Contains(err.Error(), `"replica-b"`) {
		t.Fatalf("got %v, want an error naming the bad address", err)
	}
}
