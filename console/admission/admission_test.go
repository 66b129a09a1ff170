package admission

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// clock is a test's time, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }
func quiet() *slog.Logger            { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func fixed(f float64) func() float64 { return func() float64 { return f } }

var bg = context.Background()

func newTest(t *testing.T, cfg Config, reg prometheus.Registerer, c *clock) *Controller {
	t.Helper()
	ctl, err := New(cfg, reg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctl.now, ctl.rand = c.now, fixed(0.5)
	ctl.sched = nil // the model has no CPU of its own; tests that need one set it
	ctl.win.start = c.now()
	return ctl
}

func TestAdmitUpToTheLimitAndSpreadTheRest(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min = 4, 1
	cfg.QueueWait = 0 // told waits only; the queue is tested on its own
	reg := prometheus.NewRegistry()
	ctl := newTest(t, cfg, reg, c)
	ctl.rate, ctl.measured = 8, true // 8 a second, slots spaced at 1.25 × that: one every 100 ms
	for i := range 4 {
		if w := ctl.Admit(bg, fmt.Sprint("box-", i)); w != 0 {
			t.Fatalf("box %d under the limit told to wait %v", i, w)
		}
	}
	if w := ctl.Admit(bg, "box-0"); w != 0 {
		t.Fatalf("a box in flight dialling again told to wait %v", w)
	}
	// Deferred boxes get successive slots, 100 ms apart (MinWait is 200 ms).
	var waits []time.Duration
	for i := range 5 {
		waits = append(waits, ctl.Admit(bg, fmt.Sprint("late-", i)))
	}
	want := []time.Duration{200 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond}
	if fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	// The spread: ±10 % around the slot.
	ctl.rand = fixed(0)
	if w := ctl.Admit(bg, "late-5"); w != 540*time.Millisecond {
		t.Fatalf("the earliest of the 6th slot: %v, want 540ms", w)
	}
	// Past the queue's end in time, a deferred box starts a new queue.
	c.add(time.Minute)
	ctl.rand = fixed(0.5)
	if w := ctl.Admit(bg, "later"); w != 200*time.Millisecond {
		t.Fatalf("after the queue drained: %v", w)
	}
	// A place given back is taken by the next box.
	ctl.CaughtUp("box-1")
	if w := ctl.Admit(bg, "late-0"); w != 0 {
		t.Fatalf("a freed place was not given: %v", w)
	}
	if got := value(t, ctl.m.sessions.WithLabelValues("deferred")); got != 7 {
		t.Fatalf("deferred counted %v, want 7", got)
	}
	if got := value(t, ctl.m.inflight); got != 4 {
		t.Fatalf("in flight gauge %v, want 4", got)
	}
	// A very slow console never tells a box to wait past MaxWait.
	ctl.rate = 1
	for i := range 1000 {
		if w := ctl.Admit(bg, fmt.Sprint("storm-", i)); w > cfg.MaxWait {
			t.Fatalf("wait %v past MaxWait", w)
		}
	}
}

// TestSlotsFollowTheRate: a box is told the slot right after the last one
// given when the rate fell since (no gap is left), and the slot behind
// those still due when it rose (none waits behind slots given too far
// apart). Before the rate is measured, no box is told past the queue's
// wait.
func TestSlotsFollowTheRate(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.QueueWait, cfg.MinWait = 1, 1, 20*time.Millisecond, time.Millisecond
	ctl := newTest(t, cfg, prometheus.NewRegistry(), c)
	ctl.Admit(bg, "in")

	// Unmeasured: no box is told past the queue's wait.
	for i := range 100 {
		if w := ctl.Admit(bg, fmt.Sprint("early-", i)); w > cfg.QueueWait {
			t.Fatalf("box %d told %v before the rate was measured", i, w)
		}
	}

	// Slots are spaced at 1.25 × the rate, and each box is told to come
	// half the queue's wait (10 ms) before its slot.
	ctl.measured, ctl.promised, ctl.tail = true, nil, time.Time{}
	ctl.rate = 100 // 8 ms a slot: 100 boxes fill the next 800 ms
	for i := range 100 {
		ctl.Admit(bg, fmt.Sprint("fast-", i))
	}
	ctl.rate = 10 // the rate fell: the next slot is right after the last
	if w := ctl.Admit(bg, "after-fall"); w != 870*time.Millisecond {
		// slot: 800 ms + 80 ms
		t.Fatalf("after the rate fell: told %v, want 870ms", w)
	}
	ctl.promised, ctl.tail = nil, time.Time{}
	for i := range 100 {
		ctl.Admit(bg, fmt.Sprint("slow-", i)) // 8 s of slots, 80 ms apart
	}
	ctl.rate = 1000 // the rate rose: behind the 100 still due, 0.8 ms each
	if w := ctl.Admit(bg, "after-rise"); w != 70800*time.Microsecond {
		// slot: 101 × 0.8 ms
		t.Fatalf("after the rate rose: told %v, want 70.8ms", w)
	}
}

// TestBoxesWaitInTheQueue: a box that finds no room waits for the next
// place that frees, first come first served, while the queue drains
// within QueueWait at the measured rate; past that, or past its
// patience, it is told when to come back.
func TestBoxesWaitInTheQueue(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.QueueWait = 2, 1, time.Hour
	reg := prometheus.NewRegistry()
	ctl := newTest(t, cfg, reg, c)
	ctl.rate = 2 // two places a second: the queue holds 7,200

	var releases []func()
	for range 2 {
		_, release, w := ctl.Reserve(bg, time.Second)
		if w != 0 {
			t.Fatalf("told to wait %v with room", w)
		}
		releases = append(releases, release)
	}
	type answer struct {
		i    int
		wait time.Duration
	}
	answers := make(chan answer)
	stop, cancel := context.WithCancel(bg)
	defer cancel()
	for i := range 3 {
		go func() {
			ctx := bg
			if i == 2 {
				ctx = stop
			}
			_, _, w := ctl.Reserve(ctx, time.Minute)
			answers <- answer{i, w}
		}()
		waitFor(t, func() bool { return ctl.State().Queued == i+1 }) // in order
	}
	// A box that may wait no longer than the queue takes is told a wait
	// at once.
	if _, _, w := ctl.Reserve(bg, time.Second); w == 0 {
		t.Fatal("a box whose patience the queue outlasts was queued and given a place")
	}
	// Places freed go to the queue's head, one each.
	releases[0]()
	if a := <-answers; a.i != 0 || a.wait != 0 {
		t.Fatalf("first freed place: %+v, want box 0 admitted", a)
	}
	ctl.Admit(bg, "x") // a box with no place held does not jump the queue
	if s := ctl.State(); s.InFlight != 0 || s.Queued != 2 {
		t.Fatalf("a box without a place jumped the queue: %+v", s)
	}
	releases[1]()
	if a := <-answers; a.i != 1 || a.wait != 0 {
		t.Fatalf("second freed place: %+v, want box 1 admitted", a)
	}
	// A server that stops ends the wait: the box is told when to come back.
	cancel()
	if a := <-answers; a.i != 2 || a.wait == 0 {
		t.Fatalf("a box whose wait was ended: %+v, want box 2 told to come back", a)
	}
	if got := value(t, ctl.m.sessions.WithLabelValues("queued")); got != 3 {
		t.Fatalf("queued counted %v, want 3", got)
	}
	if got := value(t, ctl.m.queued); got != 0 {
		t.Fatalf("queue gauge %v after it emptied, want 0", got)
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
	}
}

func TestAbandonedSessionsGiveTheirPlaceBack(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min = 2, 1
	ctl := newTest(t, cfg, prometheus.NewRegistry(), c)
	ctl.Admit(bg, "a")
	ctl.Admit(bg, "b")
	if ctl.Admit(bg, "c") == 0 {
		t.Fatal("admitted past the limit")
	}
	ctl.SessionEnded("a") // the box left before catching up
	ctl.SessionEnded("x") // never admitted: nothing happens
	if ctl.Admit(bg, "c") != 0 {
		t.Fatal("the place of a session that ended was not given back")
	}
	c.add(cfg.Patience + time.Second)
	ctl.adapt() // b and c outlasted their patience
	if s := ctl.State(); s.InFlight != 0 {
		t.Fatalf("%d in flight after their patience", s.InFlight)
	}
	if got := value(t, ctl.m.abandoned.WithLabelValues("patience")); got != 2 {
		t.Fatalf("abandoned by patience: %v", got)
	}
	if got := value(t, ctl.m.abandoned.WithLabelValues("session_ended")); got != 1 {
		t.Fatalf("abandoned by session end: %v", got)
	}
	ctl.CaughtUp("b") // too late: already forgotten
	if got := value(t, ctl.m.sessions.WithLabelValues("caught_up")); got != 0 {
		t.Fatalf("a forgotten session counted as caught up")
	}
}

func TestTheLimitFollowsCompletions(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.Max, cfg.Target = 16, 4, 40, 2*time.Second
	ctl := newTest(t, cfg, prometheus.NewRegistry(), c)
	step := func(latency time.Duration, settle, defer_ int) {
		for i := range settle {
			ctl.Admit(bg, fmt.Sprint("s", i))
		}
		c.add(latency)
		for i := range settle {
			ctl.CaughtUp(fmt.Sprint("s", i))
		}
		ctl.win.full = defer_ > 0
		c.add(cfg.Window - latency%cfg.Window)
		ctl.adapt()
	}
	// Quick sessions, boxes held back: the limit grows with what settled.
	step(100*time.Millisecond, 8, 5)
	if l := ctl.State().Limit; l != 18 {
		t.Fatalf("limit %d after a quick full window, want 18", l)
	}
	// Quick, but nobody held back: the limit stays.
	step(100*time.Millisecond, 8, 0)
	if l := ctl.State().Limit; l != 18 {
		t.Fatalf("limit %d without pressure, want 18", l)
	}
	// Slow sessions: cut by a quarter, once per Target.
	step(3*time.Second, 8, 5)
	if l := ctl.State().Limit; l != 13 {
		t.Fatalf("limit %d after slow sessions, want 13", l)
	}
	step(3*time.Second, 8, 5)
	if l := ctl.State().Limit; l != 10 {
		t.Fatalf("limit %d after slow sessions a Target later, want 10", l)
	}
	// Never under Min, never over Max.
	for range 20 {
		step(3*time.Second, 2, 5)
	}
	if l := ctl.State().Limit; l != cfg.Min {
		t.Fatalf("limit %d, want Min %d", l, cfg.Min)
	}
	for range 100 {
		step(10*time.Millisecond, 4, 5)
	}
	if l := ctl.State().Limit; l != cfg.Max {
		t.Fatalf("limit %d, want Max %d", l, cfg.Max)
	}
}

// storm simulates a console that completes capacity sessions a second,
// shared among those in flight (each needs 1/capacity s of its time), and
// n boxes arriving within spread. A box whose session has not caught up
// after patience gives up, and dials again after a full-jitter backoff
// (1 s doubling to 60 s), or after the wait a busy console told it. It
// returns when every box caught up (or at limit), and the completions per
// second over the run.
func storm(t *testing.T, ctl *Controller, c *clock, n, capacity int, patience, spread, limit time.Duration) (time.Duration, float64, int) {
	return stormWarming(t, ctl, c, n, capacity, 0, patience, spread, limit)
}

// stormWarming is storm at a console that needs coldCost × its time per
// session at first, falling evenly to 1 × over warm: a console just
// started, with cold caches and a collector catching up.
func stormWarming(t *testing.T, ctl *Controller, c *clock, n, capacity int, warm time.Duration, patience, spread, limit time.Duration) (time.Duration, float64, int) {
	t.Helper()
	const dt = 20 * time.Millisecond
	type box struct {
		next     time.Time // when it dials
		fails    int
		started  time.Time
		work     float64 // seconds of the console's time still needed
		in       bool
		done     bool
		queued   *waiter // waiting for a place since queuedAt
		queuedAt time.Time
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	start := c.now()
	boxes := make([]*box, n)
	for i := range boxes {
		boxes[i] = &box{next: start.Add(time.Duration(rnd.Int64N(int64(spread) + 1)))}
	}
	need := 1 / float64(capacity)
	done, dials := 0, 0
	var inflight []int
	begin := func(i int, b *box, r *reservation, now time.Time) {
		ctl.Admit(context.WithValue(bg, reservationKey{}, r), fmt.Sprint(i))
		b.in, b.started, b.work = true, now, need
		inflight = append(inflight, i)
	}
	for c.now().Sub(start) < limit && done < n {
		now := c.now()
		for i, b := range boxes {
			if w := b.queued; w != nil {
				// In the queue: a place given, or its wait ran out.
				if w.r == nil && now.Sub(b.queuedAt) < ctl.cfg.QueueWait {
					continue
				}
				b.queued = nil
				if r, wait := ctl.leave(w); r == nil {
					b.next = now.Add(wait)
				} else {
					begin(i, b, r, now)
				}
				continue
			}
			if b.done || b.in || now.Before(b.next) {
				continue
			}
			dials++
			r, w, wait := ctl.enter(ctl.cfg.QueueWait)
			switch {
			case r != nil:
				begin(i, b, r, now)
			case w != nil:
				b.queued, b.queuedAt = w, now
			default:
				b.next = now.Add(wait)
			}
		}
		// Processor sharing: each in flight gets 1/k of the time.
		if k := len(inflight); k > 0 {
			share := dt.Seconds() / float64(k)
			if since := now.Sub(start); since < warm {
				share /= coldCost - (coldCost-1)*float64(since)/float64(warm)
			}
			kept := inflight[:0]
			for _, i := range inflight {
				b := boxes[i]
				b.work -= share
				switch {
				case b.work <= 0:
					b.in, b.done = false, true
					done++
					ctl.CaughtUp(fmt.Sprint(i))
				case now.Sub(b.started) > patience:
					b.in = false
					ctl.SessionEnded(fmt.Sprint(i))
					max := math.Min(60, math.Pow(2, float64(b.fails)))
					b.fails++
					b.next = now.Add(time.Duration(rnd.Float64() * max * float64(time.Second)))
				default:
					kept = append(kept, i)
				}
			}
			inflight = kept
		}
		c.add(dt)
		if c.now().Sub(start)%ctl.cfg.Window == 0 && ctl.cfg.Max < unlimited {
			ctl.adapt()
		}
	}
	took := c.now().Sub(start)
	return took, float64(done) / took.Seconds(), dials
}

// coldCost is how much more a session costs a console that just started.
const coldCost = 5

// unlimited, as a Config's Max, makes a controller that admits everyone.
const unlimited = 1 << 30

// TestAStormConverges is the metastable failure in miniature: thousands
// of boxes at once at a console that completes a few dozen or hundred
// sessions a second, and boxes that give up after 30 s. Admitting
// everyone, every session shares the console with thousands of others and
// few finish in 30 s: the boxes that gave up come back and share it again.
// Admitting by capacity, all come back at close to the console's rate,
// with few dials each, whether the first guess of the rate (200/s) is far
// too high or too low.
func TestAStormConverges(t *testing.T) {
	for _, c := range []struct {
		name        string
		n, capacity int
		unlimited   bool
	}{
		{"admitting everyone", 3000, 60, true},
		{"admitting by capacity", 3000, 60, false},
		{"a fast console", 10000, 500, false},
		{"a large fleet", 15000, 150, false},
		{"a small fleet", 1000, 20, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			best := time.Duration(float64(c.n) / float64(c.capacity) * float64(time.Second))
			clk := newClock()
			cfg := DefaultConfig()
			if c.unlimited {
				cfg.Initial, cfg.Max = unlimited, unlimited
			}
			ctl := newTest(t, cfg, prometheus.NewRegistry(), clk)
			ctl.rand = rand.New(rand.NewPCG(3, 4)).Float64
			took, rate, dials := storm(t, ctl, clk, c.n, c.capacity, 30*time.Second, 5*time.Second, 4*time.Minute)
			perBox := float64(dials) / float64(c.n)
			t.Logf("%s: %v, %.1f sessions/s (capacity %d), %.2f dials per box (%v queued, %v deferred), limit %d",
				c.name, took, rate, c.capacity, perBox, value(t, ctl.m.sessions.WithLabelValues("queued")),
				value(t, ctl.m.sessions.WithLabelValues("deferred")), ctl.State().Limit)
			if c.unlimited {
				if rate > 0.5*float64(c.capacity) {
					t.Fatalf("without admission the storm went at %.0f/s: the model lost its cliff", rate)
				}
				return
			}
			if took > best*11/10 || perBox > 3 {
				t.Fatalf("the storm took %v (%.1f/s, %.2f dials per box), want within 1.1 × %v and at most 3 dials per box",
					took, rate, perBox, best)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []func(*Config){
		func(c *Config) { c.Min = 0 },
		func(c *Config) { c.Initial = c.Max + 1 },
		func(c *Config) { c.Patience = c.Target / 2 },
		func(c *Config) { c.Window = 0 },
		func(c *Config) { c.MaxWait = c.MinWait / 2 },
		func(c *Config) { c.QueueWait = -time.Second },
		func(c *Config) { c.QueueMax = -1 },
		func(c *Config) { c.CPUWait = -time.Millisecond },
		func(c *Config) { c.RejoinMin = 0 },
		func(c *Config) { c.RejoinMax = c.RejoinMin / 2 },
	} {
		cfg := DefaultConfig()
		c(&cfg)
		if cfg.Validate() == nil {
			t.Errorf("%+v passed", cfg)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	off := DefaultConfig()
	off.RejoinMax = 0 // no window told
	if err := off.Validate(); err != nil {
		t.Fatal(err)
	}
}

// value reads a counter or gauge.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// histCount and histSum read a histogram.
func histCount(t *testing.T, m prometheus.Metric) uint64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.Histogram.GetSampleCount()
}

func histSum(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.Histogram.GetSampleSum()
}

// TestReserveHoldsAPlaceBeforeTheHandshake follows places held at the
// ClientHello: taken by the box's Admit, given back when the handshake
// fails, kept for a box already in flight, and counted against the limit
// with the sessions in flight.
func TestReserveHoldsAPlaceBeforeTheHandshake(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min = 3, 1
	ctl := newTest(t, cfg, prometheus.NewRegistry(), c)

	// One handshake comes up as box a; its place counts from the hello.
	ctxA, _, w := ctl.Reserve(bg, 0) // the session comes up: the port gives nothing back
	if w != 0 {
		t.Fatalf("the first handshake told to wait %v", w)
	}
	c.add(time.Second)
	if w := ctl.Admit(ctxA, "a"); w != 0 {
		t.Fatalf("a box whose place was held told to wait %v", w)
	}
	if s := ctl.State(); s.InFlight != 1 || s.Handshakes != 0 {
		t.Fatalf("after a's admission: %+v", s)
	}
	c.add(time.Second)
	ctl.CaughtUp("a")
	if got := ctl.m.latency; histCount(t, got) != 1 || histSum(t, got) != 2 {
		t.Fatalf("catch-up latency counted %v (sum %v), want one of 2 s from the hello", histCount(t, got), histSum(t, got))
	}

	// Three handshakes fill the limit: a fourth is told to wait before
	// its handshake, and so is a box without a place.
	var releases []func()
	var ctxs []context.Context
	for i := range 3 {
		ctx, release, w := ctl.Reserve(bg, 0)
		if w != 0 {
			t.Fatalf("handshake %d told to wait %v", i, w)
		}
		ctxs, releases = append(ctxs, ctx), append(releases, release)
	}
	if _, _, w := ctl.Reserve(bg, 0); w == 0 {
		t.Fatal("a handshake past the limit was not told to wait")
	}
	if w := ctl.Admit(bg, "no-place"); w == 0 {
		t.Fatal("a box with no place held was admitted past the limit")
	}
	// A failed handshake gives its place back, and does not shrink the
	// limit: anyone can fail a handshake.
	releases[0]()
	releases[0]()
	if s := ctl.State(); s.Handshakes != 2 {
		t.Fatalf("after a failed handshake: %+v", s)
	}
	if got := value(t, ctl.m.abandoned.WithLabelValues("handshake_failed")); got != 1 || ctl.period.failed != 1 {
		t.Fatalf("failed handshakes counted %v, in the log's period %d, want 1", got, ctl.period.failed)
	}
	c.add(cfg.Target)
	ctl.adapt()
	if s := ctl.State(); s.Limit < 3 {
		t.Fatalf("a failed handshake cut the limit to %d", s.Limit)
	}
	// A box in flight that dials again keeps its place; the one held for
	// its handshake goes back.
	if w := ctl.Admit(ctxs[1], "b"); w != 0 {
		t.Fatal(w)
	}
	if w := ctl.Admit(ctxs[2], "b"); w != 0 {
		t.Fatalf("a box in flight dialling again told to wait %v", w)
	}
	if s := ctl.State(); s.InFlight != 1 || s.Handshakes != 0 {
		t.Fatalf("after b dialled twice: %+v", s)
	}
	// A box admitted whose greeting then failed gives its place back as
	// abandoned; the release of the redial does not take it twice.
	releases[1]()
	if s := ctl.State(); s.InFlight != 0 {
		t.Fatalf("after b's greeting failed: %+v", s)
	}
	releases[2]()
	if got := value(t, ctl.m.abandoned.WithLabelValues("greeting_failed")); got != 1 {
		t.Fatalf("failed greetings counted %v, want 1", got)
	}
}

// TestAWarmingConsoleIsPacedByItsBestRate: a console's first sessions are
// its slowest. Pacing deferred boxes by the rate measured while it warms
// up tells them slots far too late, and the console stands idle once it
// is warm; the best rate it measured before (RateFile) keeps it busy.
func TestAWarmingConsoleIsPacedByItsBestRate(t *testing.T) {
	const n, capacity, warm = 10000, 300, 20 * time.Second
	run := func(remembered float64) (time.Duration, float64) {
		clk := newClock()
		cfg := DefaultConfig()
		if remembered > 0 {
			cfg.RateFile = filepath.Join(t.TempDir(), "rate")
			if err := writeRate(cfg.RateFile, remembered); err != nil {
				t.Fatal(err)
			}
		}
		ctl := newTest(t, cfg, prometheus.NewRegistry(), clk)
		ctl.rand = rand.New(rand.NewPCG(3, 4)).Float64
		took, _, dials := stormWarming(t, ctl, clk, n, capacity, warm, 30*time.Second, 5*time.Second, 4*time.Minute)
		return took, float64(dials) / n
	}
	cold, coldDials := run(0)
	paced, pacedDials := run(capacity)
	t.Logf("%d boxes at a console warming over %v to %d/s: %v (%.2f dials per box) pacing by the rate measured, %v (%.2f) by the best rate remembered",
		n, warm, capacity, cold, coldDials, paced, pacedDials)
	// The warm-up costs at most what the slow first 20 s lose, about 13 s
	// of the console's time.
	if best := time.Duration(n/capacity) * time.Second; paced > best+15*time.Second || pacedDials > 3 {
		t.Fatalf("paced by the best rate: %v and %.2f dials per box, want within %v and at most 3", paced, pacedDials, best+15*time.Second)
	}
}

func TestRateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rate")
	if r := readRate(path); r != 0 {
		t.Fatalf("no file: %v", r)
	}
	for _, bad := range []string{"", "abc", "-5", "0.5", "1e9", "NaN", "+Inf", "12.5\x00junk", strings.Repeat("1", 100)} {
		os.WriteFile(path, []byte(bad), 0o600)
		if r := readRate(path); r != 0 {
			t.Fatalf("%q read as %v", bad, r)
		}
	}
	if err := writeRate(path, 312.25); err != nil {
		t.Fatal(err)
	}
	if r := readRate(path); r != 312.2 && r != 312.3 {
		t.Fatalf("read back %v", r)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}

	// The controller keeps its best rate over a full span only, and writes
	// it when it changed.
	clk := newClock()
	cfg := DefaultConfig()
	cfg.RateFile = path
	ctl := newTest(t, cfg, prometheus.NewRegistry(), clk)
	if ctl.pace() < 0.75*312 {
		t.Fatalf("pace %v with 312/s remembered", ctl.pace())
	}
	ctl.best = 400
	ctl.saveRate()
	if r := readRate(path); r != 400 {
		t.Fatalf("saved %v, want 400", r)
	}
	os.Remove(path)
	ctl.saveRate() // unchanged: not written again
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("rewritten although unchanged: %v", err)
	}
}

// TestASlowerConsoleIsNotPacedByItsPast: a console far slower than the
// rate it remembers (moved to a smaller machine, starved) is paced by
// what it measures once warm: its boxes come back a bounded number of
// times, not in an endless storm of busy answers.
func TestASlowerConsoleIsNotPacedByItsPast(t *testing.T) {
	const n, capacity = 3000, 20
	clk := newClock()
	cfg := DefaultConfig()
	cfg.RateFile = filepath.Join(t.TempDir(), "rate")
	if err := writeRate(cfg.RateFile, 400); err != nil {
		t.Fatal(err)
	}
	ctl := newTest(t, cfg, prometheus.NewRegistry(), clk)
	ctl.born = clk.now()
	ctl.rand = rand.New(rand.NewPCG(3, 4)).Float64
	took, rate, dials := storm(t, ctl, clk, n, capacity, 30*time.Second, 5*time.Second, 6*time.Minute)
	perBox := float64(dials) / n
	t.Logf("%d boxes at %d/s remembering 400/s: %v (%.1f/s), %.2f dials per box", n, capacity, took, rate, perBox)
	if best := time.Duration(n/capacity) * time.Second; took > best*12/10 || perBox > 4 {
		t.Fatalf("took %v, %.2f dials per box; want within 1.2 × %v and at most 4", took, perBox, best)
	}
}

// quickFullWindow runs one adapt window of ctl in which every place is
// taken, a box is turned away, and every session catches up in 10 ms.
func quickFullWindow(ctl *Controller, c *clock, round int) {
	for i := range int(ctl.limit) + 1 {
		ctl.Admit(bg, fmt.Sprint(round, "-", i))
	}
	c.add(10 * time.Millisecond)
	for i := range int(ctl.limit) + 1 {
		ctl.CaughtUp(fmt.Sprint(round, "-", i))
	}
	c.add(ctl.cfg.Window - 10*time.Millisecond)
	ctl.adapt()
}

// TestTheCPUWaitIsShown: the scheduler's latency over each window is
// the gauge's, and the worst of a log period is the log line's; without
// CPUWait it does not move the limit.
func TestTheCPUWaitIsShown(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.QueueWait, cfg.CPUWait = 100, 1, 0, 0
	ctl := newTest(t, cfg, prometheus.NewRegistry(), c)
	waits := []time.Duration{400 * time.Millisecond, 20 * time.Millisecond}
	ctl.sched = func() (time.Duration, bool) { d := waits[0]; waits = waits[1:]; return d, true }
	for round := range 2 {
		before := ctl.limit
		quickFullWindow(ctl, c, round)
		if ctl.limit <= before {
			t.Fatalf("round %d: quick sessions left the limit at %v", round, ctl.limit)
		}
	}
	if got := value(t, ctl.m.sched); got != 0.02 {
		t.Fatalf("the gauge says %v, want the last window's 0.02", got)
	}
	if ctl.busiest != 400*time.Millisecond {
		t.Fatalf("the log period's worst is %v", ctl.busiest)
	}
}

func TestHistogramQuantile(t *testing.T) {
	buckets := []float64{0, 0.001, 0.01, 0.1, 1, math.Inf(1)}
	for _, tc := range []struct {
		counts []uint64
		q      float64
		want   time.Duration
		ok     bool
	}{
		{[]uint64{0, 0, 0, 0, 0}, 0.99, 0, false},
		{[]uint64{100, 0, 0, 0, 0}, 0.99, time.Millisecond, true},
		{[]uint64{98, 1, 1, 0, 0}, 0.99, 10 * time.Millisecond, true},
		{[]uint64{98, 0, 1, 1, 0}, 0.99, 100 * time.Millisecond, true},
		{[]uint64{98, 0, 0, 1, 1}, 0.99, time.Second, true},
		{[]uint64{0, 0, 0, 0, 5}, 0.99, time.Second, true}, // the last bucket has no upper bound: its lower
		{[]uint64{50, 50, 0, 0, 0}, 0.5, time.Millisecond, true},
	} {
		got, ok := histogramQuantile(tc.counts, buckets, tc.q)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%v at %v: %v %v, want %v %v", tc.counts, tc.q, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := histogramQuantile([]uint64{1}, buckets, 0.5); ok {
		t.Error("counts and buckets that do not match gave a quantile")
	}
}

// TestTheSchedulersLatencyIsRead: this runtime has the metric, and a
// window in which goroutines ran has a latency.
func TestTheSchedulersLatencyIsRead(t *testing.T) {
	l := newSchedLatency()
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() { defer wg.Done(); time.Sleep(time.Millisecond) }()
	}
	wg.Wait()
	if _, ok := l.quantile(0.99); !ok {
		t.Fatal("no scheduler latency after 100 goroutines ran")
	}
}

// TestALongCPUWaitCutsTheLimit: with CPUWait set, a window in which the
// scheduler's p99 wait passed it counts as slow, however quick the
// sessions, and the limit does not grow again within a Target of it.
// Without CPUWait the wait is only shown (TestTheCPUWaitIsShown).
func TestALongCPUWaitCutsTheLimit(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.QueueWait, cfg.CPUWait = 100, 1, 0, 250*time.Millisecond
	ctl := newTest(t, cfg, prometheus.NewRegistry(), c)
	var wait time.Duration
	ctl.sched = func() (time.Duration, bool) { return wait, true }
	round := 0
	window := func(cpu time.Duration) float64 {
		round++
		wait = cpu
		quickFullWindow(ctl, c, round)
		return ctl.limit
	}
	if l := window(100 * time.Millisecond); l <= 100 {
		t.Fatalf("a quick window with the CPU keeping up left the limit at %v", l)
	}
	before := ctl.limit
	if l := window(400 * time.Millisecond); l != before*0.75 {
		t.Fatalf("a window with the CPU 400 ms behind took the limit from %v to %v, want a quarter off", before, l)
	}
	cut := ctl.limit
	for i := 0; c.now().Sub(ctl.cpuBusy)+cfg.Window < cfg.Target; i++ {
		if l := window(10 * time.Millisecond); l != cut {
			t.Fatalf("window %d after the cut: the limit went from %v to %v within a Target", i, cut, l)
		}
	}
	if l := window(10 * time.Millisecond); l <= cut {
		t.Fatalf("a Target after the CPU caught up, the limit stays at %v", l)
	}

	// A console that completes less than cpuCutFloor of its best rate is
	// not cut for the CPU's wait: fewer sessions did not shorten it.
	ctl.best, ctl.rate = 1000, 700
	before = ctl.limit
	if l := window(400 * time.Millisecond); l < before {
		t.Fatalf("at 70 %% of its best rate the CPU's wait cut the limit from %v to %v", before, l)
	}
}

// TestHeldBackSaysWhenABoxLastFoundNoRoom: a window with room for every
// box leaves it where it was; one in which a box found none sets it to
// the window's end.
func TestHeldBackSaysWhenABoxLastFoundNoRoom(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.QueueWait = 4, 1, 0
	ctl := newTest(t, cfg, nil, c)
	ctl.Admit(bg, "a")
	c.add(cfg.Window)
	ctl.adapt()
	if got := ctl.HeldBack(); !got.IsZero() {
		t.Fatalf("no box held back, yet HeldBack is %v", got)
	}
	quickFullWindow(ctl, c, 0)
	if got, want := ctl.HeldBack(), c.now(); !got.Equal(want) {
		t.Fatalf("HeldBack is %v, want the full window's end %v", got, want)
	}
}

// TestRejoinIsTheTimeToGreetEveryBox: the window told to boxes is the
// boxes online here, queued or handshaking, over the best rate known
// (this run's only once warm); nothing without a rate, or when the boxes'
// own window is long enough, and never past RejoinMax (none when it is
// 0). The gauge shows the last one told.
func TestRejoinIsTheTimeToGreetEveryBox(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.QueueWait = 2, 1, 0
	ctl := newTest(t, cfg, nil, c)
	ctl.born = c.now()
	if got := ctl.Rejoin(10000); got != 0 {
		t.Fatalf("no rate known: told %v", got)
	}
	ctl.recalled = 100 // from RateFile; boxes asked to arrive at that rate
	for _, tc := range []struct {
		online int
		want   time.Duration
	}{{1000, 10 * time.Second}, {450, 0}, {500, 5 * time.Second}, {1_000_000, time.Minute}, {-5, 0}} {
		if got := ctl.Rejoin(tc.online); got != tc.want {
			t.Fatalf("Rejoin(%d) with 100/s remembered: %v, want %v", tc.online, got, tc.want)
		}
	}
	ctl.best = 200 // measured this run: not while the console warms up
	if got := ctl.Rejoin(2000); got != 20*time.Second {
		t.Fatalf("Rejoin(2000) with 200/s measured while warming up, 100/s remembered: %v, want 20s", got)
	}
	c.add(warmUp) // then the better of the two counts
	if got := ctl.Rejoin(900); got != 0 {
		t.Fatalf("Rejoin(900) at 200/s: %v, want 0 (4.5 s is within the boxes' own)", got)
	}
	if got := ctl.Rejoin(2000); got != 10*time.Second {
		t.Fatalf("Rejoin(2000) at 200/s: %v, want 10s", got)
	}
	// Boxes queued count; those told when to come back do not.
	cfg.QueueWait = time.Minute
	ctl = newTest(t, cfg, nil, c)
	ctl.born, ctl.best, ctl.rate, ctl.measured = c.now().Add(-warmUp), 200, 200, true
	ctl.Admit(bg, "a")
	ctl.Admit(bg, "b")
	qctx, leave := context.WithCancel(bg)
	defer leave()
	for range 500 {
		go ctl.Reserve(qctx, time.Minute)
	}
	waitFor(t, func() bool { return ctl.State().Queued == 500 })
	if got := ctl.Rejoin(1500); got != 10*time.Second {
		t.Fatalf("1,500 online and 500 queued at 200/s: %v, want 10s", got)
	}
	for i := range 500 {
		ctl.Admit(bg, fmt.Sprint(i))
	}
	if got := ctl.Rejoin(1500); got != 10*time.Second {
		t.Fatalf("500 more told to come back: %v, want still 10s", got)
	}
	if got := value(t, ctl.m.rejoin); got != 10 {
		t.Fatalf("the gauge shows %v s, want the 10 s last told", got)
	}
	// A RejoinMax of 0 tells nothing (--box-rejoin-max 0).
	cfg.RejoinMax = 0
	ctl = newTest(t, cfg, nil, c)
	ctl.born, ctl.best = c.now().Add(-warmUp), 200
	if got := ctl.Rejoin(2000); got != 0 {
		t.Fatalf("RejoinMax 0: told %v, want nothing", got)
	}
}

// TestAStormSpreadOverTheRejoinWindowIsTurnedAwayLess: boxes that spread
// their return over the window the console told them arrive at about the
// pace it greets them, and far fewer are turned away than when all
// return within their own 5 s; the storm ends no later, whether the rate
// the console remembered is the one it has, or half as much again (a
// best measured with fewer boxes online than return after a restart).
func TestAStormSpreadOverTheRejoinWindowIsTurnedAwayLess(t *testing.T) {
	const n, capacity = 15000, 300
	run := func(remembered float64, spread func(*Controller) time.Duration) (time.Duration, float64) {
		clk := newClock()
		cfg := DefaultConfig()
		cfg.RateFile = filepath.Join(t.TempDir(), "rate")
		if err := writeRate(cfg.RateFile, remembered); err != nil {
			t.Fatal(err)
		}
		ctl := newTest(t, cfg, prometheus.NewRegistry(), clk)
		ctl.rand = rand.New(rand.NewPCG(3, 4)).Float64
		took, _, _ := storm(t, ctl, clk, n, capacity, 30*time.Second, spread(ctl), 4*time.Minute)
		return took, value(t, ctl.m.sessions.WithLabelValues("deferred")) / n
	}
	own := func(*Controller) time.Duration { return DefaultConfig().RejoinMin }
	for _, remembered := range []float64{capacity, capacity * 3 / 2} {
		var window time.Duration
		told := func(ctl *Controller) time.Duration { window = ctl.Rejoin(n); return window }
		took, busy := run(remembered, told)
		ownTook, ownBusy := run(remembered, own)
		t.Logf("%d boxes at %d/s remembering %.0f/s: within 5 s, %v with %.2f busy answers per box; within the %v told, %v with %.2f",
			n, capacity, remembered, ownTook, ownBusy, window, took, busy)
		if took > ownTook+time.Second || busy > ownBusy*2/3 {
			t.Fatalf("remembering %.0f/s: within the window told %v and %.2f busy answers per box, within 5 s %v and %.2f",
				remembered, took, busy, ownTook, ownBusy)
		}
	}
}
