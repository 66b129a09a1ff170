// Package admission admits box sessions at the rate the console completes
// them. A session is in flight from its admission until its Sync stream is
// caught up. The console's port asks before the box's TLS handshake
// (Reserve), so a box with no room costs no crypto; the tunnel asks again
// once the handshake names the box (Admit), which takes the place held
// for it. The number in flight is bounded by a
// limit that adapts to measured completions: it grows while sessions catch
// up within Target and the limit is what holds boxes back, and shrinks by a
// quarter when they take longer or are abandoned (their session ended
// before catching up, or they outlasted Patience).
//
// A box that finds no room waits for one in a queue, first come first
// served, when the queue ahead of it drains within QueueWait at the
// measured completion rate; the next place that frees goes to it, so the
// console never idles while boxes wait. A box beyond that is told when to
// come back: behind every box queued or still due back, at a little over
// the measured rate, less half the queue's span, spread by ±10 %. Boxes
// so come back while the queue still holds work, and one that comes back early waits
// in the queue instead of dialling again; a storm of boxes returns at the
// pace the console can take them instead of all at once again.
package admission

import (
	"container/heap"
	"container/list"
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
	// QueueWait bounds how long a box waits in the queue for a place
	// (less if its handshake has less time left); QueueMax bounds how
	// many wait at once.
	QueueWait time.Duration
	QueueMax  int
	// InitialRate is the completion rate (sessions a second) assumed
	// until one is measured. Too high costs a few boxes an extra dial;
	// too low leaves the console idle while boxes wait, so it errs high.
	InitialRate float64
	// RateFile, when set, is where the best completion rate the console
	// measured is kept across restarts (see pace).
	RateFile string
	// LogEvery is how often the rates are logged while boxes are held
	// back.
	LogEvery time.Duration
	// CPUWait, when set, also counts a window as slow when runnable
	// goroutines waited longer than this for the CPU (the scheduler's
	// p99), and the limit then does not grow for a Target: an operator's
	// call, woken by the network, waits that long once or more, whatever
	// the sessions' own times. Target alone cannot stand in for it: a
	// box on a mobile line spends seconds of its session in round trips.
	CPUWait time.Duration
	// RejoinMin and RejoinMax bound the rejoin window told to boxes
	// (Rejoin): one shorter than RejoinMin is not told, and the boxes keep
	// their own (tunnel.DefaultRejoin); one longer is cut to RejoinMax.
	// A RejoinMax of 0 tells the boxes nothing.
	RejoinMin, RejoinMax time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Initial: 256, Min: 8, Max: 4096, Target: 5 * time.Second, Patience: time.Minute,
		Window: 250 * time.Millisecond, MinWait: 200 * time.Millisecond, MaxWait: 60 * time.Second, LogEvery: 5 * time.Second,
		InitialRate: 200, QueueWait: 15 * time.Second, QueueMax: 3072, CPUWait: 250 * time.Millisecond,
		RejoinMin: 5 * time.Second, RejoinMax: time.Minute}
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
	case c.QueueWait < 0 || c.QueueMax < 0 || c.CPUWait < 0:
		return errors.New("admission: QueueWait, QueueMax and CPUWait must not be negative")
	case c.InitialRate < 1:
		return errors.New("admission: InitialRate must be at least 1")
	case c.RejoinMin <= 0 || c.RejoinMax != 0 && c.RejoinMax < c.RejoinMin:
		return errors.New("admission: want 0 < RejoinMin <= RejoinMax, or RejoinMax 0 (tell boxes no window)")
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
	// sched returns how long runnable goroutines waited for the CPU (the
	// Go scheduler's latency) at its 99th percentile since it was last
	// called, false with nothing scheduled: shown, and past CPUWait a
	// reason to cut while the console completes at least cpuCutFloor of
	// its best rate.
	sched func() (time.Duration, bool)

	mu       sync.Mutex
	limit    float64
	inflight map[string]time.Time // box → when admitted
	reserved int                  // places held for handshakes in progress
	queue    list.List            // of *waiter: boxes waiting for a place, first first
	promised slots                // when deferred boxes were told to come back
	tail     time.Time            // the last slot given within MaxWait
	rate     float64              // completions per second while full
	measured bool                 // rate is measured, not InitialRate
	best     float64              // the best rate measured over a full span in this run
	recalled float64              // the best of the run before, from RateFile
	saved    float64              // what RateFile holds
	born     time.Time            // when the controller started: the console's warm-up
	accrued  time.Time            // when the places taken were last added to the window
	recent   []sample             // the last windows the console was full in
	lastCut  time.Time            // the limit's last decrease
	cpuBusy  time.Time            // the last window the CPU waited longer than CPUWait
	heldBack time.Time            // the last window a box found no room in
	win      window               // what happened since the last adapt
	period   window               // since the last log line
	shedding bool                 // boxes were held back in the last log period
	busiest  time.Duration        // the scheduler's worst window latency in the log period
}

// window counts what happened in one adapt or log period.
type window struct {
	start                                   time.Time
	full                                    bool // a box found no room
	admitted, deferred, caughtUp, abandoned int
	queued                                  int     // boxes that waited in the queue
	placeSecs                               float64 // places taken, integrated over the window
	failed                                  int     // handshakes that gave their place back; counted per log period
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
	sl := newSchedLatency()
	c.sched = func() (time.Duration, bool) { return sl.quantile(0.99) }
	c.win.start = c.now()
	c.born = c.win.start
	c.m.limit.Set(c.limit)
	if cfg.RateFile != "" {
		c.recalled = readRate(cfg.RateFile)
		c.saved = c.recalled
	}
	return c, nil
}

// Reserve is asked before a box's TLS handshake: it holds a place for the
// session about to start, waiting up to patience (and QueueWait) in the
// queue for one, or says how long the box should wait before it dials
// again (and holds nothing). The wait in the queue ends early, with a
// wait to tell the box, when ctx ends. The context it returns carries the
// place to Admit, which takes it once the handshake names the box. The
// caller calls release only when the session did not come up (the
// handshake or the greeting failed): it gives the place back. A handshake
// that fails does not shrink the limit: anyone may fail one.
func (c *Controller) Reserve(ctx context.Context, patience time.Duration) (rctx context.Context, release func(), wait time.Duration) {
	r, w, wait := c.enter(patience)
	if w != nil {
		t := time.NewTimer(min(patience, c.cfg.QueueWait))
		select {
		case <-w.granted:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		r, wait = c.leave(w)
	}
	if r == nil {
		return ctx, noRelease, wait
	}
	return context.WithValue(ctx, reservationKey{}, r), r.release, 0
}

// enter gives a box at its ClientHello a place now (r), a place in the
// queue (w), or the wait to tell it.
func (c *Controller) enter(patience time.Duration) (r *reservation, w *waiter, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if c.queue.Len() == 0 && c.room() {
		return c.hold(now), nil, 0
	}
	c.win.full = true
	ahead := float64(c.queue.Len() + 1)
	if c.queue.Len() >= c.cfg.QueueMax ||
		time.Duration(ahead/c.rate*float64(time.Second)) > min(patience, c.cfg.QueueWait) {
		return nil, nil, c.defer1(now)
	}
	w = &waiter{granted: make(chan struct{})}
	w.elem = c.queue.PushBack(w)
	c.m.queued.Set(float64(c.queue.Len()))
	c.win.queued++
	c.period.queued++
	c.m.sessions.WithLabelValues("queued").Inc()
	return nil, w, 0
}

// leave takes w out of the queue: with its place if it was given one,
// else with the wait to tell the box.
func (c *Controller) leave(w *waiter) (*reservation, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.r != nil {
		return w.r, 0
	}
	c.queue.Remove(w.elem)
	c.m.queued.Set(float64(c.queue.Len()))
	return nil, c.defer1(c.now())
}

// waiter is a box in the queue; r is its place once given.
type waiter struct {
	elem    *list.Element
	granted chan struct{}
	r       *reservation
}

// room says whether another session fits under the limit. Hold c.mu.
func (c *Controller) room() bool { return len(c.inflight)+c.reserved < int(c.limit) }

// accrue adds the places taken until now to the window's place-seconds.
// Hold c.mu; call it before the places taken change.
func (c *Controller) accrue(now time.Time) {
	if now.After(c.accrued) {
		if !c.accrued.IsZero() {
			c.win.placeSecs += float64(len(c.inflight)+c.reserved) * now.Sub(c.accrued).Seconds()
		}
		c.accrued = now
	}
}

// hold takes a place for a handshake about to start. Hold c.mu.
func (c *Controller) hold(now time.Time) *reservation {
	c.accrue(now)
	c.reserved++
	c.m.reserved.Set(float64(c.reserved))
	return &reservation{c: c, at: now}
}

// handOut gives the places that are free to the boxes at the head of the
// queue. Hold c.mu; call it wherever a place may have freed.
func (c *Controller) handOut() {
	for c.queue.Len() > 0 && c.room() {
		w := c.queue.Remove(c.queue.Front()).(*waiter)
		w.r = c.hold(c.now())
		close(w.granted)
	}
	c.m.queued.Set(float64(c.queue.Len()))
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
		c.accrue(c.now())
		c.reserved--
		c.m.reserved.Set(float64(c.reserved))
		c.period.failed++
		c.m.abandoned.WithLabelValues("handshake_failed").Inc()
		c.handOut()
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
	c.accrue(now)
	if r != nil && r.c == c && r.state == held {
		c.reserved--
		c.m.reserved.Set(float64(c.reserved))
		r.state, r.box = taken, box
		if ok {
			r.at = c.inflight[box] // the place it had; this one is given back
			c.handOut()
		} else {
			c.inflight[box] = r.at
			c.m.inflight.Set(float64(len(c.inflight)))
		}
		c.countAdmitted()
		return 0
	}
	if ok || (c.queue.Len() == 0 && c.room()) {
		if !ok {
			c.inflight[box] = now
			c.m.inflight.Set(float64(len(c.inflight)))
		}
		c.countAdmitted()
		return 0
	}
	c.win.full = true
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
	// The box's slot, at the rate the console completes sessions now:
	// behind every box queued or still due back (a slot given while the
	// rate was lower does not hold back those given after), or right
	// after the last slot given and the queue, whichever is sooner (slots
	// given while the rate was higher left no gap before the next). The
	// box is told to come back half the queue's wait before it, so it
	// comes while the queue still holds work, and waits there if early.
	for len(c.promised) > 0 && !c.promised[0].After(now) {
		heap.Pop(&c.promised)
	}
	// Slots are spaced as if the console were a little quicker than
	// measured: the rate lags while a console warms up (its first
	// sessions are its slowest), and a box told a slot too late leaves
	// the console idle with no way to call it sooner, while one told a
	// slot too early only waits in the queue or is told again.
	per := time.Duration(float64(time.Second) / (c.pace() * slotOptimism))
	// How long the queue holds work for, full: QueueWait, or less when
	// QueueMax boxes are served sooner. The queue's boxes served before
	// this one are no more than that (the rest will leave it and be told
	// slots of their own).
	span := min(c.cfg.QueueWait, time.Duration(c.cfg.QueueMax)*per)
	queued := min(time.Duration(c.queue.Len())*per, span)
	slot := now.Add(time.Duration(len(c.promised)+1)*per + queued)
	if next := later(c.tail, now.Add(queued)).Add(per); next.Before(slot) {
		slot = next
	}
	// Until the rate is measured, no box is told a slot further than the
	// queue's wait: one guessed too low would leave the console idle
	// when its time comes, and the box cannot be told sooner.
	horizon := c.cfg.MaxWait
	if !c.measured {
		horizon = max(c.cfg.MinWait, c.cfg.QueueWait)
	}
	if slot.Sub(now) <= horizon {
		c.tail = later(c.tail, slot)
	}
	wait := min(max(slot.Sub(now)-span/2, c.cfg.MinWait), horizon)
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
	now := c.now()
	c.accrue(now)
	delete(c.inflight, box)
	c.m.inflight.Set(float64(len(c.inflight)))
	c.handOut()
	lat := now.Sub(at)
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
	c.accrue(c.now())
	delete(c.inflight, box)
	c.m.inflight.Set(float64(len(c.inflight)))
	c.handOut()
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
			c.saveRate()
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
	c.accrue(now)
	w := c.win
	c.win = window{start: now}
	if w.full {
		c.heldBack = now
	}
	// The rate the console completes sessions at, by Little's law: the
	// places taken on average over the time a session takes, over the
	// last rateWindows windows in which boxes found no room, so the
	// console's pace is measured, not the boxes'. Unlike counting
	// completions, it holds when sessions admitted together complete
	// together, in bursts. Windows of a storm's first moments, before any
	// session could finish, are left out.
	if w.full && now.After(w.start) && (w.caughtUp > 0 || len(c.recent) > 0) {
		var took time.Duration
		for _, l := range w.latencies {
			took += l
		}
		c.recent = append(c.recent, sample{span: now.Sub(w.start), placeSecs: w.placeSecs, done: len(w.latencies), took: took})
		if len(c.recent) > rateWindows {
			c.recent = c.recent[1:]
		}
		var sum sample
		for _, r := range c.recent {
			sum.span, sum.placeSecs, sum.done, sum.took = sum.span+r.span, sum.placeSecs+r.placeSecs, sum.done+r.done, sum.took+r.took
		}
		if len(c.recent) >= minRateWindows && sum.done >= minRateSessions && sum.took > 0 {
			places := sum.placeSecs / sum.span.Seconds()
			c.rate = max(1, places/(sum.took.Seconds()/float64(sum.done)))
			c.measured = true
			if len(c.recent) == rateWindows {
				c.best = max(c.best, c.rate)
			}
		}
	}

	slow := w.abandoned > 0
	if c.sched != nil {
		if d, ok := c.sched(); ok {
			c.m.sched.Set(d.Seconds())
			c.busiest = max(c.busiest, d)
			if c.cfg.CPUWait > 0 && d > c.cfg.CPUWait && c.rate >= cpuCutFloor*c.best {
				slow = true
				c.cpuBusy = now
			}
		}
	}
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
	case !slow && w.full && now.Sub(c.cpuBusy) >= c.cfg.Target:
		// The limit held boxes back and sessions were quick: try more,
		// in step with how many settled. Not within a Target of a window
		// the CPU was behind in: the wait comes in bursts, and growing
		// between them undid each cut.
		c.limit = min(float64(c.cfg.Max), c.limit+max(1, float64(w.caughtUp)/4))
	}
	c.m.limit.Set(c.limit)
	c.m.rate.Set(c.rate)
	c.handOut()
}

// cpuCutFloor is the share of the best completion rate below which the
// CPU's wait cuts the limit no more: not all of the wait comes from the
// sessions in flight (boxes told to come back, the sessions already up),
// and cutting on a wait that fewer sessions do not shorten would take the
// limit to Min and the console's goodput with it.
const cpuCutFloor = 0.8

// logRates logs one line for the last period while boxes are being held
// back, and one when that stops.
func (c *Controller) logRates() {
	c.mu.Lock()
	p, limit, inflight, rate, queued, busiest := c.period, int(c.limit), len(c.inflight), c.rate, c.queue.Len(), c.busiest
	c.period = window{}
	c.busiest = 0
	was := c.shedding
	c.shedding = p.deferred > 0 || p.queued > 0
	c.mu.Unlock()
	secs := c.cfg.LogEvery.Seconds()
	switch {
	case c.shedding:
		c.log.Info("box sessions admitted at the console's pace; the rest wait in the queue or are told when to come back",
			"admitted_per_s", round(float64(p.admitted)/secs), "queued_per_s", round(float64(p.queued)/secs),
			"deferred_per_s", round(float64(p.deferred)/secs), "queue", queued,
			"caught_up_per_s", round(float64(p.caughtUp)/secs), "abandoned", p.abandoned,
			"handshakes_failed", p.failed, "limit", limit, "in_flight", inflight,
			"completion_rate_per_s", round(rate), "cpu_wait_p99_max", busiest.Round(time.Millisecond))
	case was:
		c.log.Info("box sessions admitted without waiting again", "limit", limit, "in_flight", inflight)
	}
}

// pace is the rate deferred boxes' slots are spaced at: the rate measured
// now, but, in the console's first warmUp, no less than paceFloor of the
// best it measured over a full span, in this run or the one before. A
// console's first sessions are its slowest (cold caches, every box
// arriving at once, a collector catching up), so the rate it measures
// while it warms up can be a fifth of what it does a minute later; slots
// spaced at that rate leave it idle for tens of seconds while boxes wait
// out what they were told, and they cannot be called sooner. A slot told
// too early costs a box one more busy answer, or a wait in the queue.
// After warmUp the measurement alone counts: a console that is truly
// slower than it was (a smaller machine, a starved one) must not be
// paced by its past, or its boxes come back far too early, again and
// again, and the busy answers take what the sessions need.
func (c *Controller) pace() float64 {
	if c.now().Sub(c.born) < warmUp {
		return max(c.rate, max(c.best, c.recalled)*paceFloor)
	}
	return c.rate
}

// paceFloor is the share of the best measured rate slots are never spaced
// slower than while the console warms up, for warmUp.
const (
	paceFloor = 0.75
	warmUp    = 30 * time.Second
)

// saveRate writes the best rate measured this run to RateFile when it
// changed, so the next start paces its first storm by it. It is this
// run's best, not the best ever: a console moved to a slower machine
// forgets the old machine's pace after one storm.
func (c *Controller) saveRate() {
	c.mu.Lock()
	best, saved := c.best, c.saved
	c.mu.Unlock()
	if c.cfg.RateFile == "" || best == 0 || best == saved {
		return
	}
	if err := writeRate(c.cfg.RateFile, best); err != nil {
		c.log.Warn("could not keep the measured completion rate for the next start", "err", err)
		return
	}
	c.mu.Lock()
	c.saved = best
	c.mu.Unlock()
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func round(f float64) float64 { return float64(int(f*10+0.5)) / 10 }

// sample is one full window: its length, the places taken integrated
// over it, and the sessions that caught up in it with the time they took.
type sample struct {
	span      time.Duration
	placeSecs float64
	done      int
	took      time.Duration
}

// rateWindows is how many full windows the rate is measured over: 5 s of
// the default 250 ms windows, enough to smooth the bursts in which
// sessions admitted together complete; minRateSpan is the least time it
// is measured over.
const (
	rateWindows     = 20
	minRateWindows  = 2
	minRateSessions = 16
)

// slotOptimism is how much quicker than measured the console is taken to
// be when boxes are told their slots.
const slotOptimism = 1.25

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

// Rejoin returns the window over which boxes should spread their return
// should every session here end at once (the console restarted, or its
// machine lost its link), for boxes to be told while they are online; 0
// tells them nothing. The boxes are those with sessions here (online),
// queued or handshaking; not those told when to come back, whose slots
// count a box once for each time it was told, and for a while after it
// came back. Without a window, every box returns within its own few
// seconds, and most of a fleet the console cannot greet that fast is
// turned away and told when to come back: 14,000–17,200 busy answers in
// a storm of 15,000 boxes on half a core (docs/benchmarks.md).
//
// The window has the boxes arrive at the best rate the console measured,
// this run or the last, not faster. Too long a window leaves the console
// idle while boxes wait it out, and nothing can call them sooner; too
// short costs a busy answer and one more dial for each box the queue
// cannot hold. The best rate is measured over a few seconds while the
// console is full, most often with fewer boxes online than after a
// restart, so a returning fleet is greeted slower than that: 300–350 a
// second at 15,000 boxes on half a core, against a best of 445–490
// measured as they first came. Arriving at the best rate keeps the
// window within the time the storm takes anyway, and the queue takes
// most of the surplus. The best of this run counts once the console is
// warm: the rate it measures in its first seconds can be a fifth of what
// it reaches, and a box told a window from it keeps it until its next
// vitals report. No rate known, or a window under RejoinMin, tells
// nothing.
func (c *Controller) Rejoin(online int) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	rate := c.recalled
	if c.now().Sub(c.born) >= warmUp {
		rate = max(rate, c.best)
	}
	if rate <= 0 {
		c.m.rejoin.Set(0)
		return 0
	}
	boxes := max(online, 0) + c.queue.Len() + c.reserved
	w := time.Duration(float64(boxes) / rate * float64(time.Second))
	if w < c.cfg.RejoinMin {
		w = 0
	}
	w = min(w, c.cfg.RejoinMax) // none when RejoinMax is 0
	c.m.rejoin.Set(w.Seconds())
	return w
}

// HeldBack returns when a box last found no room (at the end of that
// window), zero if none has yet.
func (c *Controller) HeldBack() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heldBack
}

// State is a snapshot, for tests and the metrics.
type State struct {
	Limit, InFlight, Handshakes, Queued int
	Rate                                float64
}

// State returns the controller's state now.
func (c *Controller) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return State{Limit: int(c.limit), InFlight: len(c.inflight), Handshakes: c.reserved, Queued: c.queue.Len(), Rate: c.rate}
}

type metrics struct {
	sessions  *prometheus.CounterVec
	abandoned *prometheus.CounterVec
	limit     prometheus.Gauge
	inflight  prometheus.Gauge
	reserved  prometheus.Gauge
	queued    prometheus.Gauge
	rate      prometheus.Gauge
	rejoin    prometheus.Gauge
	sched     prometheus.Gauge
	latency   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgebox_admission_sessions_total",
			Help: "Box sessions by what admission did: admitted, queued (waited for a place), deferred (told when to come back), caught_up."}, []string{"result"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgebox_admission_abandoned_total",
			Help: "Box sessions given a place that never caught up, by reason: handshake_failed, greeting_failed, session_ended, patience."}, []string{"reason"}),
		limit: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_limit",
			Help: "Box sessions allowed between admission and caught up."}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_in_flight",
			Help: "Box sessions between admission and caught up."}),
		reserved: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_handshakes",
			Help: "Places held for box sessions whose TLS handshake is in progress."}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_queued",
			Help: "Boxes waiting in the queue for a place, their ClientHello in."}),
		rate: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_completion_rate",
			Help: "Box sessions caught up per second while boxes found no room: the pace queued and deferred boxes are given."}),
		rejoin: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_rejoin_window_seconds",
			Help: "The window boxes were last told to spread their return over should their sessions break; 0 tells them to keep their own."}),
		sched: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgebox_admission_cpu_wait_seconds",
			Help: "How long the console's runnable goroutines waited for the CPU in the last window, at the 99th percentile (the Go scheduler's latency)."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "edgebox_admission_catch_up_seconds",
			Help: "Time from a box session's admission until its Sync stream caught up.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
	}
	if reg != nil {
		reg.MustRegister(m.sessions, m.abandoned, m.limit, m.inflight, m.reserved, m.queued, m.rate, m.rejoin, m.sched, m.latency)
	}
	return m
}
