package gcpace

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestThePaceRisesWhileBoxesAreHeldBackAndComesBack(t *testing.T) {
	now := time.Unix(1000, 0)
	var last time.Time
	gogc := 100
	p, err := New(DefaultConfig(), func() time.Time { return last }, quiet())
	if err != nil {
		t.Fatal(err)
	}
	p.now = func() time.Time { return now }
	p.set = func(v int) int { old := gogc; gogc = v; return old }
	budget, live := uint64(8<<30), uint64(1<<30)
	p.budget = func() uint64 { return budget }
	p.live = func() uint64 { return live }

	p.step()
	if gogc != 100 {
		t.Fatalf("never busy: GOGC %d, want 100", gogc)
	}
	last = now
	p.step()
	if gogc != 200 {
		t.Fatalf("boxes held back: GOGC %d, want 200", gogc)
	}
	// Held back in bursts: within Hold of the last one, the pace stays.
	now = now.Add(9 * time.Second)
	p.step()
	if gogc != 200 {
		t.Fatalf("9 s after boxes were held back: GOGC %d, want 200", gogc)
	}
	now = now.Add(2 * time.Second)
	p.step()
	if gogc != 100 {
		t.Fatalf("11 s after: GOGC %d, want 100 again", gogc)
	}
	// A pace someone else set in the meantime is what it goes back to.
	gogc = 150
	last = now
	p.step()
	now = now.Add(time.Minute)
	p.step()
	if gogc != 150 {
		t.Fatalf("after the second storm: GOGC %d, want 150", gogc)
	}
	// The heap stays within its budget: 2.5 GiB over 1 GiB live leaves
	// room for 150 %; as the live heap grows, less; never below the usual
	// pace.
	gogc, budget = 100, 5<<29
	last = now
	p.step()
	if gogc != 150 {
		t.Fatalf("2.5 GiB budget, 1 GiB live: GOGC %d, want 150", gogc)
	}
	live = 2 << 30
	p.step()
	if gogc != 100 {
		t.Fatalf("2.5 GiB budget, 2 GiB live: GOGC %d, want the usual 100", gogc)
	}
	// The budget is read when a storm begins; not known, the pace stays.
	storm := func(before int) {
		now = now.Add(time.Minute)
		p.step() // the last storm is over
		gogc = before
		last = now
		p.step()
	}
	live, budget = 1<<30, 0
	storm(100)
	if gogc != 100 {
		t.Fatalf("budget not known: GOGC %d, want the usual 100", gogc)
	}
	// A collector someone turned off stays off.
	budget = 8 << 30
	storm(-1)
	if gogc != -1 {
		t.Fatalf("with the collector off: GOGC %d, want it left off", gogc)
	}
}

func TestRunPutsThePaceBack(t *testing.T) {
	t.Setenv("GOGC", "") // as the runtime does, Run takes an empty GOGC for none
	cfg := DefaultConfig()
	cfg.Every = time.Millisecond
	gogc := 100
	p, err := New(cfg, time.Now, quiet())
	if err != nil {
		t.Fatal(err)
	}
	p.budget = func() uint64 { return 8 << 30 }
	p.live = func() uint64 { return 1 << 30 }
	raised := make(chan struct{})
	var once sync.Once
	p.set = func(v int) int {
		old := gogc
		gogc = v
		if v == 200 {
			once.Do(func() { close(raised) })
		}
		return old
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	<-raised
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if gogc != 100 {
		t.Fatalf("after Run: GOGC %d, want 100", gogc)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Percent: -1}, {Percent: 400}, {Percent: 400, Hold: time.Second}} {
		if c.Validate() == nil {
			t.Errorf("%+v was accepted", c)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("off: %v", err)
	}
}

// With GOGC in the environment, or the pacer off, Run returns at once and
// never sets the pace, however busy the console.
func TestTheOperatorsPaceIsLeftAlone(t *testing.T) {
	for _, c := range []struct {
		gogc    string
		percent int
	}{{"200", 200}, {"", 0}} {
		t.Setenv("GOGC", c.gogc)
		cfg := DefaultConfig()
		cfg.Percent, cfg.Every = c.percent, time.Millisecond
		p, err := New(cfg, time.Now, quiet())
		if err != nil {
			t.Fatal(err)
		}
		p.set = func(v int) int { t.Errorf("GOGC=%q, Percent %d: set to %d", c.gogc, c.percent, v); return 100 }
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if err := p.Run(ctx); err != nil || ctx.Err() != nil {
			t.Fatalf("GOGC=%q, Percent %d: Run: %v, and it returned only when ctx ended: %v", c.gogc, c.percent, err, ctx.Err())
		}
		cancel()
	}
}
