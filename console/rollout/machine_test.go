package rollout

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeWorld is a fleet as the machine sees it: a box told to update runs B
// after startTicks ticks, healthy unless it is bad; held boxes stay held.
type fakeWorld struct {
	told  map[string]int // box → ticks since it was told to run B
	bad   map[string]string
	held  map[string]string
	seen  map[string]Seen
	order []string // boxes in the order they were told
}

func newWorld(ids []string) *fakeWorld {
	w := &fakeWorld{told: map[string]int{}, bad: map[string]string{}, held: map[string]string{}, seen: map[string]Seen{}}
	for _, id := range ids {
		w.seen[id] = Seen{Runs: "A", Healthy: true}
	}
	return w
}

func (w *fakeWorld) apply(st Step) {
	for _, id := range st.Update {
		w.told[id] = 0
		w.order = append(w.order, id)
	}
	for _, id := range st.Revert {
		delete(w.told, id)
		w.seen[id] = Seen{Runs: "A", Healthy: true}
	}
}

func (w *fakeWorld) tick() map[string]Seen {
	for id, n := range w.told {
		w.told[id] = n + 1
		if n+1 >= 2 {
			if f := w.bad[id]; f != "" {
				w.seen[id] = Seen{Runs: "A", Failure: f}
			} else {
				w.seen[id] = Seen{Runs: "B", Healthy: true}
			}
		}
	}
	out := map[string]Seen{}
	for id, s := range w.seen {
		s.Hold = w.held[id]
		out[id] = s
	}
	return out
}

func region(name string, n, sites int) Region {
	r := Region{Name: name}
	for i := range n {
		r.Boxes = append(r.Boxes, &Box{ID: fmt.Sprintf("%s-%03d", name, i), Site: fmt.Sprintf("%s-s%d", name, i%sites)})
	}
	return r
}

func ids(rs ...Region) []string {
	var out []string
	for _, r := range rs {
		for _, b := range r.Boxes {
			out = append(out, b.ID)
		}
	}
	return out
}

// run ticks the machine a minute at a time until it is over or max ticks.
func run(m *Machine, w *fakeWorld, max int) (done []string, steps []Step) {
	now := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	for i := 0; i < max && !m.Over(); i++ {
		st := m.Tick(now, Known(w.tick()))
		w.apply(st)
		steps = append(steps, st)
		if st.RegionDone != "" {
			done = append(done, st.RegionDone)
		}
		now = now.Add(time.Minute)
	}
	return done, steps
}

func TestARolloutGoesRegionByRegionInWaves(t *testing.T) {
	t.Parallel()
	east, west := region("east", 40, 8), region("west", 10, 2)
	s := DefaultSettings
	s.MaxUnavailable = 2
	m := NewMachine("A", "B", s, []Region{east, west})
	w := newWorld(ids(east, west))
	done, _ := run(m, w, 2000)
	if !m.Over() || m.Stopped != "" || strings.Join(done, ",") != "east,west" {
		t.Fatalf("over %v, stopped %q, regions done %v", m.Over(), m.Stopped, done)
	}
	// Waves in order: east's first box before anything else, every east
	// box before any west one.
	if w.order[0] != "east-000" || !strings.HasPrefix(w.order[40], "west-") || len(w.order) != 50 {
		t.Fatalf("order %v", w.order)
	}
	for _, r := range m.Regions {
		for _, b := range r.Boxes {
			if b.Phase != Done {
				t.Errorf("%s ended %s %s", b.ID, b.Phase, b.Reason)
			}
		}
	}
}

func TestNeverMoreThanMaxUnavailableOfASite(t *testing.T) {
	t.Parallel()
	east := region("east", 30, 3)
	s := DefaultSettings
	s.MaxUnavailable = 2
	s.Gate = 0
	m := NewMachine("A", "B", s, []Region{east})
	w := newWorld(ids(east))
	now := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	for i := 0; i < 500 && !m.Over(); i++ {
		w.apply(m.Tick(now, Known(w.tick())))
		perSite := map[string]int{}
		for _, b := range m.Regions[0].Boxes {
			if b.Phase == Updating {
				perSite[b.Site]++
			}
		}
		for site, n := range perSite {
			if n > 2 {
				t.Fatalf("tick %d: %d boxes of %s updating at once", i, n, site)
			}
		}
		now = now.Add(time.Minute)
	}
	if !m.Over() || m.Stopped != "" {
		t.Fatalf("not over: %q", m.Stopped)
	}
}

func TestAFailureInTheFirstWaveStopsAndReverts(t *testing.T) {
	t.Parallel()
	east := region("east", 20, 4)
	m := NewMachine("A", "B", DefaultSettings, []Region{east})
	w := newWorld(ids(east))
	w.bad["east-000"] = "probe"
	_, steps := run(m, w, 100)
	if !strings.Contains(m.Stopped, "1 of 1 boxes of wave 1") {
		t.Fatalf("stopped %q", m.Stopped)
	}
	var reverted []string
	for _, st := range steps {
		reverted = append(reverted, st.Revert...)
	}
	if strings.Join(reverted, ",") != "east-000" || len(w.order) != 1 {
		t.Fatalf("reverted %v, updated %v", reverted, w.order)
	}
	if b := m.Regions[0].Boxes[0]; b.Phase != Failed || b.Reason != "probe" {
		t.Errorf("box %+v", b)
	}
}

func TestFailuresUnderTheThresholdAreRevertedAndTheRolloutGoesOn(t *testing.T) {
	t.Parallel()
	east := region("east", 100, 10)
	s := DefaultSettings
	s.MaxUnavailable = 10
	m := NewMachine("A", "B", s, []Region{east})
	w := newWorld(ids(east))
	w.bad["east-050"] = "start" // the waves are 1, 9, 40 and 50 boxes: this one is 1 of the last 50
	done, steps := run(m, w, 2000)
	if m.Stopped != "" || strings.Join(done, ",") != "east" {
		t.Fatalf("stopped %q, done %v", m.Stopped, done)
	}
	last := steps[len(steps)-1]
	if !slices.Equal(last.KeepOnA, []string{"east-050"}) {
		t.Errorf("the region's last step keeps %v on A, want east-050", last.KeepOnA)
	}
	// Past the threshold (more than 10 % of a wave), the rollout stops.
	m = NewMachine("A", "B", s, []Region{east})
	w = newWorld(ids(east))
	for i := 50; i < 57; i++ { // 7 of the last wave's 50 fail: 14 %
		w.bad[fmt.Sprintf("east-%03d", i)] = "pull"
	}
	run(m, w, 2000)
	if !strings.Contains(m.Stopped, "wave 4") {
		t.Fatalf("stopped %q", m.Stopped)
	}
}

func TestHeldBoxesWaitAndSayWhy(t *testing.T) {
	t.Parallel()
	east := region("east", 10, 1)
	s := DefaultSettings
	s.Gate = time.Minute
	m := NewMachine("A", "B", s, []Region{east})
	w := newWorld(ids(east))
	w.held["east-000"] = "inside a no-update window (workdays 15:00–17:30, Asia/Shanghai)"
	run(m, w, 30)
	if m.Over() || len(w.order) != 0 {
		t.Fatalf("a held box was updated: %v", w.order)
	}
	b := m.Regions[0].Boxes[0]
	if b.Phase != Held || !strings.Contains(b.Reason, "no-update window") {
		t.Fatalf("box %+v", b)
	}
	delete(w.held, "east-000") // the window ends
	run(m, w, 500)
	if !m.Over() || m.Stopped != "" {
		t.Fatalf("after the window: over %v, %q", m.Over(), m.Stopped)
	}
}

func TestABoxThatNeverComesIsFailedForTimeout(t *testing.T) {
	t.Parallel()
	east := region("east", 1, 1)
	s := DefaultSettings
	s.BoxTimeout = 10 * time.Minute
	m := NewMachine("A", "B", s, []Region{east})
	w := newWorld(ids(east))
	w.told = map[string]int{} // the fakeWorld never moves: the box is offline
	now := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	for i := 0; i < 20 && !m.Over(); i++ {
		m.Tick(now, Known(map[string]Seen{"east-000": {Runs: "A", Healthy: true}}))
		now = now.Add(time.Minute)
	}
	if b := m.Regions[0].Boxes[0]; b.Phase != Failed || b.Reason != "timeout" || m.Stopped == "" {
		t.Fatalf("box %+v, stopped %q", b, m.Stopped)
	}
}

// TestAMachineCarriesOnFromItsStoredForm: stored and read back mid-way, as
// a console restart does, the machine ends where one never stopped ends,
// with no box told twice.
func TestAMachineCarriesOnFromItsStoredForm(t *testing.T) {
	t.Parallel()
	east, west := region("east", 30, 3), region("west", 12, 2)
	m := NewMachine("A", "B", DefaultSettings, []Region{east, west})
	w := newWorld(ids(east, west))
	w.bad["east-020"] = "probe" // 1 of the last wave's 15: under the threshold
	now := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	for i := 0; i < 2000 && !m.Over(); i++ {
		if i%7 == 3 { // a restart: the machine comes back from its stored form
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			var back Machine
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatal(err)
			}
			m = &back
		}
		w.apply(m.Tick(now, Known(w.tick())))
		now = now.Add(time.Minute)
	}
	if !m.Over() || m.Stopped != "" {
		t.Fatalf("over %v, stopped %q", m.Over(), m.Stopped)
	}
	seen := map[string]bool{}
	for _, id := range w.order {
		if seen[id] {
			t.Errorf("%s was told to update twice", id)
		}
		seen[id] = true
	}
	if len(seen) != 42 {
		t.Errorf("%d boxes told, want 42", len(seen))
	}
}

func TestTheThresholdAndRevertAll(t *testing.T) {
	t.Parallel()
	// 100 boxes: waves of 1, 9, 40 and 50. In the last, 5 failures are 10 %
	// (not more than 10 %: it goes on), 6 are past it (it stops).
	for _, tc := range []struct {
		bad       int
		revertAll bool
		stops     bool
		reverted  int
	}{
		{5, false, false, 5},
		{6, false, true, 6},
		{6, true, true, 100}, // every box moved goes back: the first three waves and all of the last, started at once
	} {
		east := region("east", 100, 100) // a site a box: nothing waits for its site
		s := DefaultSettings
		s.RevertAll = tc.revertAll
		m := NewMachine("A", "B", s, []Region{east})
		w := newWorld(ids(east))
		for i := 50; i < 50+tc.bad; i++ {
			w.bad[fmt.Sprintf("east-%03d", i)] = "pull"
		}
		_, steps := run(m, w, 2000)
		reverted := 0
		for _, st := range steps {
			reverted += len(st.Revert)
		}
		if (m.Stopped != "") != tc.stops || reverted != tc.reverted {
			t.Errorf("%d bad, revert all %v: stopped %q, %d reverted; want stops %v, %d reverted",
				tc.bad, tc.revertAll, m.Stopped, reverted, tc.stops, tc.reverted)
		}
	}
}

func TestSettingsLeftZeroStillReachEveryBoxInWaves(t *testing.T) {
	t.Parallel()
	east := region("east", 20, 20)
	m := NewMachine("A", "B", Settings{Waves: []Size{{Boxes: 1}}}, []Region{east})
	if r := m.Regions[0]; len(r.Ends) != 2 || r.Ends[1] != 20 || m.Settings.BoxTimeout <= 0 {
		t.Fatalf("waves end at %v, box timeout %v", r.Ends, m.Settings.BoxTimeout)
	}
	// A gating box not heard of for a tick is not failed for it.
	w := newWorld(ids(east))
	now := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	for i := 0; i < 3; i++ {
		w.apply(m.Tick(now, Known(w.tick())))
		now = now.Add(time.Minute)
	}
	if b := m.Regions[0].Boxes[0]; b.Phase != Gating {
		t.Fatalf("first box %+v", b)
	}
	m.Tick(now, Known(map[string]Seen{}))
	if b := m.Regions[0].Boxes[0]; b.Phase != Gating {
		t.Fatalf("a box not heard of for a tick: %+v", b)
	}
}

// TestABoxOnItsWayBackCountsAsDown: a box that failed and was sent back
// holds its site's place until it runs A again, so a site never has more
// than max unavailable boxes down, the failed one included.
func TestABoxOnItsWayBackCountsAsDown(t *testing.T) {
	now := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	r := Region{Name: "east", Boxes: []*Box{{ID: "a", Site: "s"}, {ID: "b", Site: "s"}, {ID: "c", Site: "s"}}}
	m := NewMachine("A", "B", Settings{Waves: []Size{{Boxes: 1}, {Percent: 100}}, MaxUnavailable: 1, FailurePercent: 100}, []Region{r})
	seen := map[string]Seen{"a": {Runs: "A", Healthy: true}, "b": {Runs: "A", Healthy: true}, "c": {Runs: "A", Healthy: true}}
	if st := m.Tick(now, Known(seen)); !slices.Equal(st.Update, []string{"a"}) {
		t.Fatalf("first tick: %+v", st)
	}
	seen["a"] = Seen{Runs: "B", Healthy: true}
	now = now.Add(time.Minute)
	m.Tick(now, Known(seen)) // a runs B: gating
	now = now.Add(time.Minute)
	if st := m.Tick(now, Known(seen)); !slices.Equal(st.Update, []string{"b"}) {
		t.Fatalf("second wave: %+v", st)
	}
	seen["b"] = Seen{Failure: "start: it does not start"}
	now = now.Add(time.Minute)
	if st := m.Tick(now, Known(seen)); !slices.Equal(st.Revert, []string{"b"}) || len(st.Update) != 0 {
		t.Fatalf("b failed: %+v, want it sent back and c held", st)
	}
	seen["b"] = Seen{} // on its way back: runs nothing yet
	now = now.Add(time.Minute)
	if st := m.Tick(now, Known(seen)); len(st.Update) != 0 {
		t.Fatalf("c started while b was still down: %+v", st)
	}
	if c := m.Regions[0].Boxes[2]; c.Phase != Held || !strings.Contains(c.Reason, "already has 1 boxes updating") {
		t.Errorf("c: %s %q", c.Phase, c.Reason)
	}
	seen["b"] = Seen{Runs: "A", Healthy: true}
	now = now.Add(time.Minute)
	if st := m.Tick(now, Known(seen)); !slices.Equal(st.Update, []string{"c"}) {
		t.Fatalf("b back on A: %+v, want c started", st)
	}
}
