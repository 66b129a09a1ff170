// Package gcpace lets the console's heap grow further between garbage
// collections while boxes are being held back, and brings it back once
// they are not.
//
// Why (docs/benchmarks.md, "The collector's pace in a storm"): the
// collector's work at each cycle is the live heap, which is the fleet the
// console holds, and a cycle comes each time the heap grows by GOGC percent
// of it. A returning fleet allocates quickly: every session's handshake,
// hello and sync. At the default of 100 the collector took a seventh of a
// one-core console's CPU through a 15,000-box storm. At 200 while boxes
// were held back, the same console on half a core brought that fleet back
// in 44–45 s instead of 51–60 s, its heap peaking an eighth higher; 400
// was no quicker there, peaked a third higher, and the API's p99 passed
// 1 s in three runs of four. The idle console keeps its usual pace.
//
// The raised pace is held to what lets the heap stay within GOMEMLIMIT,
// or half the machine's memory when none is set, and never falls below
// the usual one. A GOGC set in the environment is the operator's choice,
// and the pacer leaves it alone.
package gcpace

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/edgebox/edgebox/internal/meminfo"
)

// Config tunes the pacer.
type Config struct {
	// Percent is the GOGC the console runs at while boxes are held back;
	// 0 leaves the pace alone.
	Percent int
	// Hold is how long after boxes were last held back the pace stays
	// raised: a storm holds boxes back in bursts, as deferred boxes come
	// back at their slots.
	Hold time.Duration
	// Every is how often the pacer looks.
	Every time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Percent: 200, Hold: 10 * time.Second, Every: time.Second}
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	switch {
	case c.Percent < 0:
		return errors.New("gcpace: Percent must not be negative")
	case c.Percent > 0 && (c.Hold <= 0 || c.Every <= 0):
		return errors.New("gcpace: Hold and Every must be positive")
	}
	return nil
}

// Pacer raises the collector's target while the console is busy. Run owns
// it; it is not for concurrent use.
type Pacer struct {
	cfg    Config
	busy   func() time.Time // when boxes were last held back; zero if never
	set    func(int) int    // sets GOGC, returns the one before
	budget func() uint64    // the most the heap should reach, in bytes; 0 if not known
	live   func() uint64    // the live heap at the last collection, in bytes
	now    func() time.Time
	log    *slog.Logger

	normal int    // the pace to go back to
	raised int    // the pace set while busy; 0 when not raised
	room   uint64 // budget(), read when the pace was raised
}

// New returns a pacer that asks busy when boxes were last held back. It
// starts nothing.
func New(cfg Config, busy func() time.Time, log *slog.Logger) (*Pacer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Pacer{cfg: cfg, busy: busy, set: debug.SetGCPercent, budget: heapBudget, live: liveHeap,
		now: time.Now, log: log.With("component", "gcpace")}, nil
}

// Run paces the collector until ctx ends, then puts the pace back and
// returns nil. It does nothing when the pacer is off or GOGC is set in the
// environment.
func (p *Pacer) Run(ctx context.Context) error {
	if p.cfg.Percent == 0 {
		return nil
	}
	if v := os.Getenv("GOGC"); v != "" {
		p.log.Info("GOGC is set; the collector keeps its pace through reconnect storms", "GOGC", v)
		return nil
	}
	t := time.NewTicker(p.cfg.Every)
	defer t.Stop()
	defer p.lower()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			p.step()
		}
	}
}

// step raises the pace while boxes were held back within Hold, as far as
// the heap's budget allows, and lowers it once they were not.
func (p *Pacer) step() {
	last := p.busy()
	if last.IsZero() || p.now().Sub(last) >= p.cfg.Hold {
		if p.raised != 0 {
			p.lower()
			p.log.Info("boxes are no longer held back; the collector is back at its pace", "gogc", p.normal)
		}
		return
	}
	first := p.raised == 0
	if first {
		// SetGCPercent is the only way to read the pace: set the
		// most, then what fits below.
		p.normal = p.set(p.cfg.Percent)
		p.raised, p.room = p.cfg.Percent, p.budget()
	}
	if want := p.pace(); want != p.raised {
		p.set(want)
		p.raised = want
	}
	if first {
		p.log.Info("boxes are being held back; the heap may grow further between collections", "gogc", p.raised, "was", p.normal)
	}
}

// pace is the GOGC to run at while busy: Percent, less where the heap it
// lets grow would pass the budget, and never below the usual pace (nor
// any pace where the collector was off).
func (p *Pacer) pace() int {
	live := p.live()
	if p.room == 0 || live == 0 || p.normal < 0 {
		return p.normal
	}
	fit := 100 * (float64(p.room)/float64(live) - 1)
	return max(p.normal, min(p.cfg.Percent, int(fit)))
}

func (p *Pacer) lower() {
	if p.raised != 0 {
		p.set(p.normal)
		p.raised = 0
	}
}

// heapBudget is what the heap may grow to while the pace is raised:
// GOMEMLIMIT when set, else half the machine's memory, 0 when neither is
// known (and the pace stays).
func heapBudget() uint64 {
	if l := debug.SetMemoryLimit(-1); l > 0 && l < math.MaxInt64 {
		return uint64(l)
	}
	total, _ := meminfo.Read(meminfo.Path) // 0 where there is no /proc
	return total / 2
}

// liveHeap is the heap's live bytes at the last collection.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
