// Package admission admits box sessions at the rate the console completes
// them. A session is in flight from its admission until its Sync stream is
// caught up. The console's port asks before the box's TLS handshake
// (Reserve), so a box with no room costs no crypto; the tunnel asks again
// once the handshake names the box (Admit), which takes the place held
// for it. The number in flight is bounded by a
// limit that adapts to measured completions: it grows while sessions catch
// up within Target and the limit is what holds boxes back, and shrinks by a
// quarter when they take longer or are abandoned (their session ended
// before catching up, or they outlasted Patience). A box that is not
// admitted is told when to come back: behind every box still due back, at
// the measured completion rate, spread by ±10 %, so a storm of boxes
// returns at the pace the console can take them instead of all at once
// again.
package admission

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config tunes the controller.
type Config struct {
	// Initial, Min and Max bound the limit on sessions in flight.
	Initial, Min, Max int
	// Target is the time from admission to caught up the limit keeps
	// sessions under: well inside what a box waits for its hello and
	// sync answers (30 s), so admitted work is never thrown away.
	Target time.Duration
	// Patience is how long an admitted session may take to catch up
	// before it counts as abandoned and gives its place back.
	Patience time.Duration
	// Window is how often the limit adapts and expired sessions go.
	Window time.Duration
	// MinWait and MaxWait bound the wait a deferred box is told, before it
	// is spread by ±10 %.
	MinWait, MaxWait time.Duration
	// InitialRate is the completion rate (sessions a second) assumed
	// until one is measured. Too high costs a few boxes an extra dial;
	// too low leaves the console idle while boxes wait, so it errs high.
	InitialRate float64
	// LogEvery is how often the rates are logged while boxes are held
	// back.
	LogEvery time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Initial: 256, Min: 8, Max: 4096, Target: 5 * time.Second, Patience: time.Minute,
		Window: 250 * time.Millisecond, MinWait: 200 * time.Millisecond, MaxWait: 30 * time.Second, LogEvery: 5 * time.Second,
		InitialRate: 200}
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	switch {
	case c.Min < 1 || c.Initial < c.Min || c.Max < c.Initial:
		return errors.New("admission: want 1 <= Min <= Initial <= Max")
	case c.Target <= 0 || c.Patience < c.Target || c.Window <= 0 || c.LogEvery <= 0:
		return errors.New("admission: Target, Window and LogEvery must be positive, Patience at least Target")
	case c.MinWait <= 0 || c.MaxWait < c.MinWait:
		return errors.New("admission: want 0 < MinWait <= MaxWait")
	case c.InitialRate < 1:
		return errors.New("admission: InitialRate must be at least 1")
	}
	return nil
}

// Controller decides which box sessions start now. It is safe for
// concurrent use; Run adapts it.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	now  func() time.Time
	rand func() float64
	m    metrics

	mu       sync.Mutex
	limit    float64
	inflight map[string]time.Time // box → when admitted
	reserved int                  // places held for handshakes in progress
	promised slots                // when deferred boxes were told to come back
	rate     float64              // completions per second at the limit
	recent   []sample             // the last windows the console was full in
	lastCut  time.Time            // the limit's last decrease
	win      window               // what happened since the last adapt
	period   window               // since the last log line
	shedding bool                 // boxes were held back in the last log period
}

// window counts what happened in one adapt or log period.
type window struct {
	admitted, deferred, caughtUp, abandoned int
	failed                                  int // handshakes that gave their place back; counted per log period
	latencies                               []time.Duration
}

// New returns a controller; reg may be nil.
func New(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, log: log.With("component", "admission"), now: time.Now, rand: rand.Float64,
		m: newMetrics(reg), limit: float64(cfg.Initial), inflight: make(map[string]time.Time),
		rate: cfg.InitialRate}
	c.m.limit.Set(c.limit)
	return c, nil
}

// Reserve is asked before a box's TLS handshake: it holds a place for the
// session about to start, or says how long the box should wait before it
// dials again (and holds nothing). The context it returns carries the
// place to Admit, which takes it once the handshake names the box. The
// caller calls release only when the session did not come up (the
// handshake or the greeting failed): it gives the place back. A handshake
// that fails does not shrink the limit: anyone may fail one.
func (c *Controller) Reserve(ctx context.Context) (rctx context.Context, release func(), wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if len(c.inflight)+c.reserved >= int(c.limit) {
		return ctx, noRelease, c.defer1(now)
	}
	c.reserved++
	c.m.reserved.Set(float64(c.reserved))
	r := &reservation{c: c, at: now}
	return context.WithValue(ctx, reservationKey{}, r), r.release, 0
}

// noRelease is the release of a box told to wait: it holds nothing.
func noRelease() {}

// reservation is a place held from a box's ClientHello on.
type reservation struct {
	c     *Controller
	at    time.Time
	box   string // set when Admit took it
	state uint8  // held, taken or released; guarded by c.mu
}

const (
	held uint8 = iota
	taken
	released
)

type reservationKey struct{}

// release gives the place back: the session did not come up.
func (r *reservation) release() {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.state {
	case held:
		c.reserved--
		c.m.reserved.Set(float64(c.reserved))
		c.period.failed++
		c.m.abandoned.WithLabelValues("handshake_failed").Inc()
	case taken:
		// The box was admitted, but its session did not come up.
		if at, ok := c.inflight[r.box]; ok && at.Equal(r.at) {
			c.abandon(r.box, "greeting_failed")
		}
	}
	r.state = released
}

// Admit says whether box may start a session now: 0 when it may, else how
// long it should wait before it dials again. A place Reserve held for it
// (in ctx) is taken, and counts from when it was held; a box already in
// flight (a redial, a renewal) keeps its place.
func (c *Controller) Admit(ctx context.Context, box string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	_, ok := c.inflight[box]
	r, _ := ctx.Value(reservationKey{}).(*reservation)
	if r != nil && r.c == c && r.state == held {
		c.reserved--
		c.m.reserved.Set(float64(c.reserved))
		r.state, r.box = taken, box
		if ok {
			r.at = c.inflight[box] // the place it had; this one is given back
		} else {
			c.inflight[box] = r.at
			c.m.inflight.Set(float64(len(c.inflight)))
		}
		c.countAdmitted()
		return 0
	}
	if ok || len(c.inflight)+c.reserved < int(c.limit) {
		if !ok {
			c.inflight[box] = now
			c.m.inflight.Set(float64(len(c.inflight)))
		}
		c.countAdmitted()
		return 0
	}
	return c.defer1(now)
}

func (c *Controller) countAdmitted() {
	c.win.admitted++
	c.period.admitted++
	c.m.sessions.WithLabelValues("admitted").Inc()
}

// defer1 counts one box turned away and returns its wait. Hold c.mu.
func (c *Controller) defer1(now time.Time) time.Duration {
	c.win.deferred++
	c.period.deferred++
	c.m.sessions.WithLabelValues("deferred").Inc()
	// The box's slot: behind every box still due back, at the rate the
	// console completes sessions now (a slot given while the rate was
	// lower does not hold back those given after).
	for len(c.promised) > 0 && !c.promised[0].After(now) {
		heap.Pop(&c.promised)
	}
	ahead := float64(len(c.promised) + 1)
	wait := time.Duration(ahead / c.rate * float64(time.Second))
	wait = min(max(wait, c.cfg.MinWait), c.cfg.MaxWait)
	// Spread after the bounds, so boxes held to MaxWait do not all come
	// back in the same instant.
	wait = time.Duration(float64(wait) * (0.9 + 0.2*c.rand()))
	if len(c.promised) < maxPromised {
		heap.Push(&c.promised, now.Add(wait))
	}
	return wait
}

// CaughtUp says box's Sync stream has caught up (or the box was told it
// waits for approval): its session is settled and gives its place back.
func (c *Controller) CaughtUp(box string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.inflight[box]
	if !ok {
		return
	}
	delete(c.inflight, box)
	c.m.inflight.Set(float64(len(c.inflight)))
	lat := c.now().Sub(at)
	c.win.caughtUp++
	c.period.caughtUp++
	c.win.latencies = append(c.win.latencies, lat)
	c.m.sessions.WithLabelValues("caught_up").Inc()
	c.m.latency.Observe(lat.Seconds())
}

// SessionEnded says box's session ended. If it had not caught up yet, the
// work done for it is lost: it counts as abandoned, and any queued work for
// it is dropped by its owners (the session's streams are gone).
func (c *Controller) SessionEnded(box string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.inflight[box]; ok {
		c.abandon(box, "session_ended")
	}
}

// abandon forgets an in-flight box. Hold c.mu.
func (c *Controller) abandon(box, why string) {
	delete(c.inflight, box)
	c.m.inflight.Set(float64(len(c.inflight)))
	c.win.abandoned++
	c.period.abandoned++
	c.m.abandoned.WithLabelValues(why).Inc()
}

// Run adapts the limit every Window and logs the rates while boxes are
// held back, until ctx ends; it returns nil then.
func (c *Controller) Run(ctx context.Context) error {
	adapt := time.NewTicker(c.cfg.Window)
	defer adapt.Stop()
	logT := time.NewTicker(c.cfg.LogEvery)
	defer logT.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-adapt.C:
			c.adapt()
		case <-logT.C:
			c.logRates()
		}
	}
}

// adapt ends one window: sessions past their patience are abandoned, the
// completion rate is smoothed in, and the limit moves.
func (c *Controller) adapt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for box, at := range c.inflight {
		if now.Sub(at) > c.cfg.Patience {
			c.abandon(box, "patience")
		}
	}
	w := c.win
	c.win = window{}
	// The rate the console completes sessions at when it is full: the
	// limit over the time a session takes, over the last rateWindows
	// windows in which sessions completed (Little's law, with the limit
	// for the sessions in flight; unlike counting completions, it holds
	// when sessions admitted together complete together, in bursts).
	// With room to spare, sessions are quick and the rate high: a box told
	// to wait comes back early rather than late, and a box that comes
	// back early to a full console is told again before any handshake,
	// which costs little, while one that comes back late leaves the
	// console idle.
	if len(w.latencies) > 0 {
		var total time.Duration
		for _, l := range w.latencies {
			total += l
		}
		c.recent = append(c.recent, sample{done: len(w.latencies), took: total})
		if len(c.recent) > rateWindows {
			c.recent = c.recent[1:]
		}
		var done int
		var took time.Duration
		for _, r := range c.recent {
			done, took = done+r.done, took+r.took
		}
		if took > 0 {
			c.rate = max(1, c.limit/(took.Seconds()/float64(done)))
		}
	}

	slow := w.abandoned > 0
	if n := len(w.latencies); n > 0 {
		sort.Slice(w.latencies, func(i, j int) bool { return w.latencies[i] < w.latencies[j] })
		slow = slow || w.latencies[n*9/10] > c.cfg.Target
	}
	switch {
	case slow && now.Sub(c.lastCut) >= c.cfg.Target:
		// Once per Target: the effect of a cut shows only after the
		// sessions in flight settle.
		c.limit = max(float64(c.cfg.Min), c.limit*0.75)
		c.lastCut = now
	case !slow && w.deferred > 0:
		// The limit held boxes back and sessions were quick: try more,
		// in step with how many settled.
		c.limit = min(float64(c.cfg.Max), c.limit+max(1, float64(w.caughtUp)/4))
	}
	c.m.limit.Set(c.limit)
	c.m.rate.Set(c.rate)
}

// logRates logs one line for the last period while boxes are being held
// back, and one when that stops.
func (c *Controller) logRates() {
	c.mu.Lock()
	p, limit, inflight, rate := c.period, int(c.limit), len(c.inflight), c.rate
	c.period = window{}
	was := c.shedding
	c.shedding = p.deferred > 0
	c.mu.Unlock()
	secs := c.cfg.LogEvery.Seconds()
	switch {
	case p.deferred > 0:
		c.log.Info("box sessions admitted at the console's pace; the rest are told when to come back",
			"admitted_per_s", round(float64(p.admitted)/secs), "deferred_per_s", round(float64(p.deferred)/secs),
			"caught_up_per_s", round(float64(p.caughtUp)/secs), "abandoned", p.abandoned,
			"handshakes_failed", p.failed, "limit", limit, "in_flight", inflight,
			"completion_rate_per_s", round(rate))
	case was:
		c.log.Info("box sessions admitted without waiting again", "limit", limit, "in_flight", inflight)
	}
}

func round(f float64) float64 { return float64(int(f*10+0.5)) / 10 }

// sample is one window's sessions that caught up, with the time they took.
type sample struct {
	done int
	took time.Duration
}

// rateWindows is how many windows with completions the rate is measured
// over: 2 s of the default 250 ms windows, enough to smooth the bursts in
// which sessions admitted together complete.
const rateWindows = 8

// maxPromised bounds the slots remembered; past it, boxes are still told a
// wait, behind the ones remembered.
const maxPromised = 1 << 17

// slots is a min-heap of times.
type slots []time.Time

func (h slots) Len() int           { return len(h) }
func (h slots) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h slots) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *slots) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *slots) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// State is a snapshot, for tests and the metrics.
type State struct {
	Limit, InFlight, Handshakes int
	Rate                        float64
}

// State returns the controller's state now.
func (c *Controller) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return State{Limit: int(c.limit), InFlight: len(c.inflight), Handshakes: c.reserved, Rate: c.rate}
}

type metrics struct {
	sessions  *prometheus.CounterVec
	abandoned *prometheus.CounterVec
	limit     prometheus.Gauge
	inflight  prometheus.Gauge
	reserved  prometheus.Gauge
	rate      prometheus.Gauge
	latency   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgebox_admission_sessions_total",
			Help: "Box sessions by what admission did: admitted, deferred (told when to come back), caught_up."}, []string{"result"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgebox_admission_abandoned_total",
			Help: "Box sessions given a place that never caught up, by reason: handshake_failed, greeting_failed, session_ended, patience."}, []string{"reason"}),
		limit: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_limit",
			Help: "Box sessions allowed between admission and caught up."}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_in_flight",
			Help: "Box sessions between admission and caught up."}),
		reserved: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_handshakes",
			Help: "Places held for box sessions whose TLS handshake is in progress."}),
		rate: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_completion_rate",
			Help: "Box sessions caught up per second, smoothed: the pace deferred boxes are given."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "edgebox_admission_catch_up_seconds",
			Help: "Time from a box session's admission until its Sync stream caught up.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
	}
	if reg != nil {
		reg.MustRegister(m.sessions, m.abandoned, m.limit, m.inflight, m.reserved, m.rate, m.latency)
	}
	return m
}
