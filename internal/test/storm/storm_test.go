// Package storm holds the reconnect storm at a small scale: a fleet that
// arrives at once at a console slower than the boxes' bounds allow, which
// must still come back whole while operators use the API.
package storm

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/console/admission"
	"github.com/edgebox/edgebox/internal/test/fleetsim"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// noAdmission admits every box at once, as the console did before it
// admitted sessions at the pace it completes them: the storm must then
// fail. It shows that the test can fail.
var noAdmission = flag.Bool("storm.noadmission", false,
	"admit every box session at once (the console before admission control); the test is expected to fail")

func TestMain(m *testing.M) {
	fleetsim.Main() // a fleet's child process runs here and exits
	os.Exit(m.Run())
}

// The storm, at a small scale. The console answers at most 80 hellos,
// Sync beginnings and acks-and-status streams a second (workers ÷ cost),
// in the order they came, with at most maxQueue waiting; the boxes wait
// bound for a hello or an acks answer, and ask again recheck after a
// hello that failed. Every box needs a hello, a Sync beginning and a few
// acks-and-status answers: about 1,300 answers for 300 boxes, 16 s of the
// console's work. The boxes arrive at once. If all were admitted, their
// first requests alone (900) would wait up to 11 s, far past bound: only
// the first ~40 hellos are answered in time, and the other boxes ask again
// while the console still does the work of what they gave up on, about
// 150 hellos a second against 80 answers: the queue never drains.
const (
	boxes     = 300
	processes = 2 // 150 agents a child process: their goroutines stay under the race detector's 8,128
	workers   = 4
	cost      = 50 * time.Millisecond
	maxQueue  = 1000 // past it, answers are refused at once, as by a busy console
	bound     = 1500 * time.Millisecond
	recheck   = 250 * time.Millisecond
	// deadline is generous: a storm the console takes at its pace ended
	// in 23 s here (29–80 s with -race), one that collapsed never does.
	deadline = 3 * time.Minute
)

// TestStorm starts a fleet of boxes all at once against a console slowed
// on purpose, with the boxes' bounds shortened to match: the fleet must
// come online and synced, with the console holding each acknowledgement,
// no session the console admitted may end, and the API must answer every
// call throughout.
func TestStorm(t *testing.T) {
	slow := newSlowConsole(workers, maxQueue, cost)
	env := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) {
		c.Hooks.BeforeHello = slow.answer
		c.Hooks.BeforeSync = slow.answer
		// Pings are not what this test slows: the default bounds, so a
		// busy test machine drops no session.
		c.Tunnel.PingInterval, c.Tunnel.PingTimeout = 2*time.Second, 10*time.Second
		c.Admission = admissionConfig(*noAdmission)
	}})
	t.Cleanup(slow.close) // before the console stops: cleanups run last first
	admin := env.Admin()

	tok := env.Token(t, api.TokenRequest{Region: "storm", Site: "lab", Uses: boxes + 20, TTL: "1h"})
	cfg := fleetsim.DefaultConfig(boxes, tok, t.TempDir())
	cfg.Processes = processes
	cfg.Log = testenv.Logger(t)
	cfg.Agent = fleetsim.AgentSettings{
		HelloTimeout: bound, UpAnswerTimeout: bound,
		// Bounds 20 times shorter than the agent's (30 s), and a box that
		// was not answered asks again soon: a few hundred boxes meet them
		// as thousands meet the agent's own.
		PendingRecheck: recheck, SyncRetry: recheck,
		PingInterval: 2 * time.Second, PingTimeout: 10 * time.Second,
	}
	t0 := time.Now()
	f, err := fleetsim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("closing the fleet: %v", err)
		}
	})
	ids := f.IDs()
	t.Logf("%d boxes enrolled by %d processes in %v", boxes, f.Processes(), time.Since(t0).Round(time.Millisecond))
	targets, err := fleetsim.PutWorkloads(admin, ids, "storm")
	if err != nil {
		t.Fatal(err)
	}

	// The storm: every agent starts at once; the operator calls the API
	// throughout.
	prober := startProber(admin)
	served0 := slow.stats()
	since, err := f.StartAgents()
	if err != nil {
		prober.stop()
		t.Fatal(err)
	}
	w := fleetsim.Window{Since: since, Target: func(i int) uint64 { return targets[i] }}
	var st fleetsim.Stats
	synced := waitUntil(deadline, func() bool {
		st = f.Stats(w)
		return st.AllSynced
	})
	// The console holds each box's acknowledgement of its state.
	var notAcked []string
	acked := synced && waitUntil(deadline-time.Since(since), func() bool {
		notAcked = unacked(t, env.Console(), ids, targets)
		return len(notAcked) == 0
	})
	took := time.Since(since)
	probes := prober.stop()
	st = f.Stats(w)
	done := slow.stats().minus(served0)
	logStorm(t, st, done, probes, took)

	switch {
	case !synced:
		t.Errorf("the fleet did not converge within %v: %d of %d boxes online and synced, %d sessions up",
			deadline, st.Synced, boxes, st.Up)
	case !acked:
		t.Errorf("the console did not take every box's acknowledgement within %v: %d missing (%s)",
			deadline, len(notAcked), first(notAcked, 5))
	}
	// Every box's hello and Sync beginning waited for the slowed console:
	// otherwise it slowed nothing, and the storm proves nothing.
	if done.answered < 2*boxes {
		t.Errorf("the slowed console gave %d answers; want at least a hello and a Sync beginning a box (%d)", done.answered, 2*boxes)
	}
	if st.Dropped != 0 {
		t.Errorf("%d sessions the console admitted were dropped; want none", st.Dropped)
	}
	if len(probes.errs) != 0 {
		t.Errorf("the API failed %d of %d calls during the storm: %s", len(probes.errs), probes.calls, first(probes.errs, 5))
	}
	if probes.calls == 0 {
		t.Errorf("the API was never called during the storm")
	}
}

// admissionConfig is the admission the storm runs with: the console's,
// with a target well inside the boxes' bound (so what is admitted is
// answered before they give up), starting small as a loaded console would
// settle; or, with none, every box admitted at once whatever happens.
func admissionConfig(none bool) admission.Config {
	c := admission.DefaultConfig()
	if none {
		c.Min, c.Initial, c.Max = 1<<20, 1<<20, 1<<20
		return c
	}
	c.Initial, c.Min = 16, 4
	c.Target, c.Patience = bound/3, 10*bound
	c.InitialRate = float64(workers) / cost.Seconds() / 4 // boxes a second: about four answers each
	c.LogEvery = time.Second
	return c
}

// slowConsole is a console of small capacity: workers answer the boxes'
// hellos, Sync beginnings and acks in the order they came, each taking
// cost, with at most maxQueue waiting. Like the console's own work (a
// hello's store transaction is done though its box stopped waiting), work
// once queued is done even when the box has given up on it; the hello
// then fails at once on its ended call.
type slowConsole struct {
	slots    chan struct{} // a token a worker; FIFO for those waiting
	maxQueue int
	cost     time.Duration
	done     chan struct{} // closed by close: every answer returns at once
	once     sync.Once

	mu      sync.Mutex // guards waiting and counts
	waiting int
	counts  counts
}

// counts are what the slow console did.
type counts struct {
	answered, late, refused int           // answers given; hellos whose caller had given up by then; refused, the queue full
	maxWait                 time.Duration // the longest an answer waited for a worker
	maxWaiting              int           // the longest the queue was
}

func (c counts) minus(o counts) counts {
	return counts{answered: c.answered - o.answered, late: c.late - o.late, refused: c.refused - o.refused,
		maxWait: c.maxWait, maxWaiting: c.maxWaiting}
}

func newSlowConsole(workers, maxQueue int, cost time.Duration) *slowConsole {
	return &slowConsole{slots: make(chan struct{}, workers), maxQueue: maxQueue, cost: cost, done: make(chan struct{})}
}

var (
	// errStopped fails what waits when the test ends.
	errStopped = errors.New("the test's slow console stopped")
	// errBusy refuses what finds the queue full.
	errBusy = errors.New("the test's slow console is busy")
)

// answer is the console's hook before each answer to box.
func (s *slowConsole) answer(ctx context.Context, box string) error {
	s.mu.Lock()
	if s.waiting >= s.maxQueue {
		s.counts.refused++
		s.mu.Unlock()
		return errBusy
	}
	s.waiting++
	s.counts.maxWaiting = max(s.counts.maxWaiting, s.waiting)
	s.mu.Unlock()
	start := time.Now()
	got := false
	select {
	case s.slots <- struct{}{}:
		got = true
	case <-s.done:
	}
	s.mu.Lock()
	s.waiting--
	s.mu.Unlock()
	if !got {
		return errStopped
	}
	defer func() { <-s.slots }()
	waited := time.Since(start)
	t := time.NewTimer(s.cost)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.done:
		return errStopped
	}
	s.mu.Lock()
	s.counts.answered++
	if ctx.Err() != nil {
		s.counts.late++
	}
	s.counts.maxWait = max(s.counts.maxWait, waited)
	s.mu.Unlock()
	return nil
}

func (s *slowConsole) stats() counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// close ends every answer waiting or under way. It is idempotent.
func (s *slowConsole) close() { s.once.Do(func() { close(s.done) }) }

// prober is the operator: it lists the boxes through the API, one call
// after another, until stopped.
type prober struct {
	cancel context.CancelFunc
	done   chan probes
}

// probes is what the prober saw.
type probes struct {
	calls     int
	errs      []string
	latencies []time.Duration
}

func startProber(admin *api.Client) *prober {
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{cancel: cancel, done: make(chan probes, 1)}
	go func() {
		var out probes
		defer func() { p.done <- out }()
		for ctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			start := time.Now()
			_, err := admin.Boxes(cctx)
			lat := time.Since(start)
			ccancel()
			if ctx.Err() != nil {
				return // stopped mid-call: not the API's failure
			}
			out.calls++
			out.latencies = append(out.latencies, lat)
			if err != nil {
				out.errs = append(out.errs, fmt.Sprintf("after %v: %v", lat.Round(time.Millisecond), err))
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return p
}

// stop ends the prober and returns what it saw.
func (p *prober) stop() probes {
	p.cancel()
	return <-p.done
}

// unacked lists the boxes whose acknowledgement of their target revision
// the console does not hold.
func unacked(t *testing.T, c *console.Console, ids []string, targets []uint64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	for i, id := range ids {
		acked, err := c.Desired().Acked(ctx, id)
		if err != nil {
			t.Fatalf("box %s's acknowledged revision: %v", id, err)
		}
		if acked < targets[i] {
			out = append(out, fmt.Sprintf("%s at %d of %d", id, acked, targets[i]))
		}
	}
	return out
}

// waitUntil polls cond every 250 ms until it holds (true) or d passes
// (false).
func waitUntil(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(250 * time.Millisecond)
	}
	return true
}

// logStorm logs the storm's figures: none of them is asserted.
func logStorm(t *testing.T, st fleetsim.Stats, c counts, p probes, took time.Duration) {
	t.Helper()
	var curve strings.Builder
	every := max(1, len(st.Curve)/30)
	for i, pt := range st.Curve {
		if i%every == 0 || i == len(st.Curve)-1 {
			fmt.Fprintf(&curve, " %.0fs:%d/%d", pt.After.Seconds(), pt.Up, pt.Synced)
		}
	}
	all := "not all online and synced"
	if st.AllSynced {
		all = fmt.Sprintf("all online and synced %v after the agents started", st.AllSyncedAfter.Round(time.Millisecond))
	}
	t.Logf("storm of %d boxes (admission off: %v): %s; watched for %v", boxes, *noAdmission, all, took.Round(time.Millisecond))
	t.Logf("dials %d (per box mean %.2f, max %d), failed connects %d (%s), sessions %d (per box %d–%d), dropped after admission %d",
		st.Dials, st.DialsMean, st.DialsMax, st.ConnectFailures, st.Failures(), st.Sessions, st.SessionsMin, st.SessionsMax, st.Dropped)
	t.Logf("slowed console: %d answers (%.0f/s over the storm), %d hellos answered after their box gave up, %d refused with the queue full; longest queue %d, longest wait for a worker %v",
		c.answered, float64(c.answered)/took.Seconds(), c.late, c.refused, c.maxWaiting, c.maxWait.Round(time.Millisecond))
	t.Logf("API: %d calls, %d failed, latency p50 %v p99 %v max %v", p.calls, len(p.errs),
		quantile(p.latencies, 0.5), quantile(p.latencies, 0.99), quantile(p.latencies, 1))
	t.Logf("boxes up/synced since the agents started:%s", curve.String())
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))].Round(time.Millisecond)
}

func first(s []string, n int) string {
	if len(s) > n {
		return strings.Join(s[:n], "; ") + fmt.Sprintf("; and %d more", len(s)-n)
	}
	return strings.Join(s, "; ")
}
