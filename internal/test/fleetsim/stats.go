package fleetsim

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Window is the stretch of time Stats adds up, and what "synced" means.
type Window struct {
	// Since is where the window begins; events before it only set each
	// box's state at its start. Zero: from the first event.
	Since time.Time
	// Until is where it ends; zero: now.
	Until time.Time
	// Step is the curve's resolution; zero: one second. It is widened to
	// keep the curve to maxPoints.
	Step time.Duration
	// Target is the revision box i must have stored to count as synced;
	// nil asks for none, so synced is online with its hello answered.
	Target func(i int) uint64
}

// maxPoints bounds a curve's length.
const maxPoints = 10000

// Point is the fleet at one moment of the window.
type Point struct {
	After  time.Duration // since the window began
	Up     int           // boxes with a session
	Synced int           // boxes online and synced
}

// Stats is what happened to the fleet in a window.
type Stats struct {
	Boxes int // in the fleet
	// At the end of the window: the boxes that left (their process was
	// killed or stopped), those with a session up, and those online and
	// synced (a session up, the console's answer to its hello on that
	// session, and the target revision stored).
	Left, Up, Synced int
	// AllSynced says whether, at the end of the window, every box that had
	// not left is online and synced; AllSyncedAfter is when that last
	// became so, after the window's start (0: so all along).
	AllSynced      bool
	AllSyncedAfter time.Duration
	// Dials are TCP dials towards the console in the window, per box;
	// ConnectFailures are attempts at a session that failed (dial, TLS or
	// tunnel handshake).
	Dials                    int
	DialsMean                float64
	DialsMin, DialsMax       int
	ConnectFailures          int
	FailedBy                 [numWhy]int // ConnectFailures by Why
	Sessions                 int         // sessions that came up in the window
	SessionsMin, SessionsMax int         // per box
	// Dropped are sessions that came up in the window and ended in it,
	// other than by their box leaving: the console admitted the box and
	// then lost it.
	Dropped int
	// Curve is the fleet every Step from the window's start, and at its
	// end.
	Curve []Point
}

// Failures says what ConnectFailures were, for a log line: "busy 3,
// refused 2", or "none".
func (st Stats) Failures() string {
	var parts []string
	for w, n := range st.FailedBy {
		if n > 0 {
			parts = append(parts, Why(w).String()+" "+strconv.Itoa(n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// boxState is one box's state while events are replayed.
type boxState struct {
	up, greeted, left bool
	rev               uint64
	upInWindow        bool // the current session came up in the window
	dials, sessions   int
}

func (b *boxState) synced(target uint64) bool {
	return b.up && b.greeted && !b.left && b.rev >= target
}

// Stats adds up the fleet's events in w.
func (f *Fleet) Stats(w Window) Stats {
	f.mu.Lock()
	var all []Event
	for _, evs := range f.events {
		all = append(all, evs...)
	}
	f.mu.Unlock()
	return summarize(len(f.ids), all, w)
}

// summarize adds up the events of a fleet of n boxes in w.
func summarize(n int, all []Event, w Window) Stats {
	if w.Until.IsZero() {
		w.Until = time.Now()
	}
	if w.Step <= 0 {
		w.Step = time.Second
	}
	if w.Since.IsZero() && len(all) > 0 {
		w.Since = slices.MinFunc(all, func(a, b Event) int { return a.At.Compare(b.At) }).At
	}
	if span := w.Until.Sub(w.Since); span/w.Step > maxPoints {
		w.Step = span / maxPoints
	}
	target := func(int) uint64 { return 0 }
	if w.Target != nil {
		target = w.Target
	}
	// Events of one box at the same instant: a session comes up before
	// its hello is answered and anything is stored on it.
	slices.SortFunc(all, func(a, b Event) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Box, b.Box))
	})

	st := Stats{Boxes: n}
	boxes := make([]boxState, n)
	var up, synced, left int
	next := w.Since // the next point of the curve
	point := func(at time.Time) {
		for !next.After(at) && !next.After(w.Until) {
			st.Curve = append(st.Curve, Point{After: next.Sub(w.Since), Up: up, Synced: synced})
			next = next.Add(w.Step)
		}
	}
	// whole: every box that has not left is synced, since became.
	whole, began := false, false
	var became time.Time
	checkAll := func(at time.Time) {
		now := synced > 0 && synced == n-left
		if now && !whole {
			became = at
		}
		whole = now
	}
	begin := func() {
		if !began {
			began = true
			checkAll(w.Since)
		}
	}
	for _, ev := range all {
		if ev.At.After(w.Until) {
			break
		}
		// The curve's points before this event see the state before it.
		point(ev.At.Add(-1))
		if !ev.At.Before(w.Since) {
			begin() // the state the window began with
		}
		b := &boxes[ev.Box]
		in := !ev.At.Before(w.Since)
		was, wasUp := b.synced(target(ev.Box)), b.up
		switch ev.Kind {
		case Dial:
			if in {
				b.dials++
				st.Dials++
			}
		case ConnectFailed:
			if in {
				st.ConnectFailures++
				if ev.Why < numWhy {
					st.FailedBy[ev.Why]++
				}
			}
		case Up:
			b.up, b.greeted, b.upInWindow = true, false, in
			if in {
				b.sessions++
				st.Sessions++
			}
		case Down:
			if b.up && b.upInWindow && in {
				st.Dropped++
			}
			b.up, b.greeted = false, false
		case Hello:
			if b.up {
				b.greeted = true
			}
		case Stored:
			b.rev = max(b.rev, ev.Rev)
		case Gone:
			if !b.left {
				b.left = true
				left++
			}
			b.up, b.greeted = false, false
		}
		if now := b.synced(target(ev.Box)); now != was {
			if now {
				synced++
			} else {
				synced--
			}
		}
		if b.up != wasUp {
			if b.up {
				up++
			} else {
				up--
			}
		}
		if in {
			checkAll(ev.At)
		}
	}
	point(w.Until)
	if end := w.Until.Sub(w.Since); end >= 0 && (len(st.Curve) == 0 || st.Curve[len(st.Curve)-1].After != end) {
		st.Curve = append(st.Curve, Point{After: end, Up: up, Synced: synced}) // the window's end
	}
	begin()
	if whole {
		st.AllSynced, st.AllSyncedAfter = true, became.Sub(w.Since)
	}
	st.Left, st.Up, st.Synced = left, up, synced

	counted := 0
	for i := range boxes {
		b := &boxes[i]
		if b.left && b.dials == 0 && b.sessions == 0 {
			continue // left before the window, or never ran in it
		}
		if counted == 0 {
			st.DialsMin, st.SessionsMin = b.dials, b.sessions
		}
		counted++
		st.DialsMin, st.DialsMax = min(st.DialsMin, b.dials), max(st.DialsMax, b.dials)
		st.SessionsMin, st.SessionsMax = min(st.SessionsMin, b.sessions), max(st.SessionsMax, b.sessions)
	}
	if counted > 0 {
		st.DialsMean = float64(st.Dials) / float64(counted)
	}
	return st
}
