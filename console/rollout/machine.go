package rollout

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Settings are the rules a rollout moves by.
type Settings struct {
	// Waves are each region's wave sizes (DefaultWaves unless set).
	Waves []Size `json:"waves"`
	// Gate is how long a wave's boxes must run B and stay healthy before
	// the next wave starts.
	Gate time.Duration `json:"gate"`
	// BoxTimeout is how long a box may take from being told to run B to
	// running it healthy; past it the box has failed ("timeout").
	BoxTimeout time.Duration `json:"box_timeout"`
	// MaxUnavailable bounds the boxes of one site being updated at once.
	MaxUnavailable int `json:"max_unavailable"`
	// FailurePercent: the rollout stops when more than this share of a
	// wave has failed; any failure in the first wave stops it.
	FailurePercent float64 `json:"failure_percent"`
	// RevertAll: when the rollout stops, every box it moved goes back to
	// A, not only the boxes that failed.
	RevertAll bool `json:"revert_all,omitempty"`
}

// normal returns s with its zero values set from DefaultSettings and the
// rest within bounds: waves that end at 100 %, a positive box timeout.
func (s Settings) normal() Settings {
	d := DefaultSettings
	if len(s.Waves) == 0 {
		s.Waves = d.Waves
	}
	if s.Waves[len(s.Waves)-1].Percent != 100 {
		s.Waves = append(slices.Clone(s.Waves), Size{Percent: 100})
	}
	if s.BoxTimeout <= 0 {
		s.BoxTimeout = d.BoxTimeout
	}
	s.Gate = max(s.Gate, 0)
	s.MaxUnavailable = max(s.MaxUnavailable, 1)
	if s.FailurePercent < 0 || s.FailurePercent > 100 {
		s.FailurePercent = d.FailurePercent
	}
	return s
}

// DefaultSettings are the defaults: 5 min gates, 15 min per box, one box
// of a site at a time, stop past 10 % of a wave.
var DefaultSettings = Settings{Waves: DefaultWaves, Gate: 5 * time.Minute, BoxTimeout: 15 * time.Minute,
	MaxUnavailable: 1, FailurePercent: 10}

// Phase is where one box stands in a rollout.
type Phase string

// The phases of a box.
const (
	Waiting  Phase = "waiting"  // its wave has not started
	Held     Phase = "held"     // its wave started; the box may not update now (Reason says why)
	Updating Phase = "updating" // told to run B; not yet running it healthy
	Gating   Phase = "gating"   // runs B, healthy since Since
	Done     Phase = "done"     // ran B healthy through its wave's gate
	Failed   Phase = "failed"   // Reason says why: pull, start, probe, timeout
)

// Box is one box of a rollout as the machine keeps it.
type Box struct {
	ID     string    `json:"id"`
	Site   string    `json:"site"`
	Phase  Phase     `json:"phase"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since,omitzero"` // when the phase began
	// Reverted: the box was told to go back to A.
	Reverted bool `json:"reverted,omitempty"`
	// PrePull: the box was asked to pre-pull B.
	PrePull bool `json:"pre_pull,omitempty"`
}

// Seen is what the world says of a box now.
type Seen struct {
	// Runs is the release of the app the box runs; Healthy whether it
	// passes its probes (true for a release without probes).
	Runs    string
	Healthy bool
	// Failure, when set, is why the box cannot run B: "pull", "start",
	// "probe".
	Failure string
	// Hold, when set, is why the box may not be updated now: a
	// maintenance window, an update lock, a key in use.
	Hold string
	// Locked: the hold is the box's own (an update lock, a key in use)
	// or its line's (down, while its site hears it running): it does not
	// act on what it is told, or cannot say it did, until the hold ends,
	// so a box told to update meanwhile is not timed out for it.
	Locked bool
	// HoldFails, when set, is the failure of a hold that lasts longer
	// than a box's timeout (a pre-pull that keeps failing).
	HoldFails string
}

// Region is one region's part of a rollout: its boxes, in wave order.
type Region struct {
	Name  string `json:"name"`
	Boxes []*Box `json:"boxes"`
	// Ends are where each wave ends in Boxes: wave i is
	// Boxes[Ends[i-1]:Ends[i]].
	Ends []int `json:"ends"`
	// Wave is the index of the wave in progress.
	Wave int `json:"wave"`
}

func (r *Region) waves() int { return len(r.Ends) }

func (r *Region) wave(i int) []*Box {
	start := 0
	if i > 0 {
		start = r.Ends[i-1]
	}
	return r.Boxes[start:r.Ends[i]]
}

// Machine steps a rollout from release A to B over regions in order.
// It decides; the controller around it applies what it decides (pins)
// and stores it. It is not safe for concurrent use.
type Machine struct {
	A        string    `json:"a"`
	B        string    `json:"b"`
	Settings Settings  `json:"settings"`
	Regions  []*Region `json:"regions"`
	// Region is the index of the region in progress; len(Regions) when
	// the rollout is over.
	Region int `json:"region"`
	// Stopped, when set, says why the rollout stopped.
	Stopped string `json:"stopped,omitempty"`
	// ApproveFirstWave: once the first wave is through, the rollout waits
	// for Approved before it goes on.
	ApproveFirstWave bool `json:"approve_first_wave,omitempty"`
	Approved         bool `json:"approved,omitempty"`
	// Watched is when a console last ticked the machine, to within a few
	// seconds: the time from then to a restarted console's first tick is
	// given back to the boxes updating (GiveBack).
	Watched time.Time `json:"watched,omitzero"`
}

// GiveBack adds d to the time the boxes updating have left: time nobody
// watched them (a console down, a rollout paused) does not count against
// their timeout.
func (m *Machine) GiveBack(d time.Duration) {
	if d <= 0 {
		return
	}
	for _, r := range m.Regions {
		for _, b := range r.Boxes {
			if b.Phase == Updating {
				b.Since = b.Since.Add(d)
			}
		}
	}
}

// Look says what the world says of a box now, and whether anything was
// heard of it.
type Look func(id string) (Seen, bool)

// Known looks boxes up in a map.
func Known(seen map[string]Seen) Look {
	return func(id string) (Seen, bool) { s, ok := seen[id]; return s, ok }
}

// AwaitsApproval reports whether the first wave is through and the
// rollout waits for its approval to go on.
func (m *Machine) AwaitsApproval() bool {
	return m.ApproveFirstWave && !m.Approved && !m.Over() && m.Region == 0 && len(m.Regions) > 0 && m.Regions[0].Wave >= 1
}

// NewMachine plans a rollout over regions (each a list of box IDs and
// their sites, in the order boxes should go). Settings left zero take
// DefaultSettings', and a last wave short of 100 % gets one that is not,
// so every box of a region is reached.
func NewMachine(a, b string, s Settings, regions []Region) *Machine {
	s = s.normal()
	m := &Machine{A: a, B: b, Settings: s}
	for i := range regions {
		r := regions[i]
		ids := make([]string, len(r.Boxes))
		byID := map[string]*Box{}
		for j, bx := range r.Boxes {
			ids[j] = bx.ID
			cp := *bx
			cp.Phase = Waiting
			byID[bx.ID] = &cp
		}
		reg := &Region{Name: r.Name}
		for _, w := range Plan(ids, s.Waves) {
			for _, id := range w {
				reg.Boxes = append(reg.Boxes, byID[id])
			}
			reg.Ends = append(reg.Ends, len(reg.Boxes))
		}
		m.Regions = append(m.Regions, reg)
	}
	return m
}

// Step is what the controller is to do after a tick.
type Step struct {
	// Update are boxes to pin to B now.
	Update []string
	// Revert are boxes to take back to A (from their own cache).
	Revert []string
	// RegionDone names a region whose waves are through: pin it to B,
	// and drop its boxes' own pins, but for KeepOnA's, which failed and
	// went back to A.
	RegionDone string
	KeepOnA    []string
}

// Over reports whether the rollout is finished or stopped.
func (m *Machine) Over() bool { return m.Stopped != "" || m.Region >= len(m.Regions) }

// Tick looks at the world at now and says what to do next.
func (m *Machine) Tick(now time.Time, seen Look) Step { return m.tick(now, seen, true) }

// Observe is Tick for a paused rollout: the boxes already told go on to
// their gate, their end or their failure (and failed ones back), but no
// box is told to start.
func (m *Machine) Observe(now time.Time, seen Look) Step { return m.tick(now, seen, false) }

func (m *Machine) tick(now time.Time, seen Look, starts bool) Step {
	var st Step
	for !m.Over() && !m.AwaitsApproval() {
		r := m.Regions[m.Region]
		if r.Wave >= r.waves() {
			st.RegionDone = r.Name
			for _, b := range r.Boxes {
				if b.Reverted {
					st.KeepOnA = append(st.KeepOnA, b.ID)
				}
			}
			m.Region++
			return st // one region a tick: its pin is written first
		}
		wave := r.wave(r.Wave)
		m.observe(now, wave, seen)
		failed, done := 0, 0
		for _, b := range wave {
			switch b.Phase {
			case Failed:
				failed++
			case Done:
				done++
			}
		}
		if m.tooMany(r, failed, len(wave)) {
			m.Stopped = fmt.Sprintf("%d of %d boxes of wave %d in region %s failed", failed, len(wave), r.Wave+1, r.Name)
			st.Revert = append(st.Revert, m.revert(func(b *Box) bool {
				return b.Phase == Failed || (m.Settings.RevertAll && b.Phase != Waiting && b.Phase != Held)
			})...)
			return st
		}
		// A box that failed goes back to A, whatever becomes of the rest.
		st.Revert = append(st.Revert, m.revert(func(b *Box) bool { return b.Phase == Failed })...)
		if done+failed < len(wave) {
			if starts {
				st.Update = append(st.Update, m.start(now, r, wave, seen)...)
			}
			return st
		}
		r.Wave++ // the wave is through: the next one, or the next region
	}
	return st
}

// revert marks the boxes of started regions that which picks, and not
// yet reverted, as reverted, and returns them.
func (m *Machine) revert(which func(*Box) bool) []string {
	var out []string
	for i := 0; i <= m.Region && i < len(m.Regions); i++ {
		for _, b := range m.Regions[i].Boxes {
			if !b.Reverted && which(b) {
				b.Reverted = true
				out = append(out, b.ID)
			}
		}
	}
	return out
}

// tooMany reports whether failed boxes of a wave of n pass the threshold.
func (m *Machine) tooMany(r *Region, failed, n int) bool {
	if failed == 0 {
		return false
	}
	if m.Region == 0 && r.Wave == 0 {
		return true // any failure in the very first wave
	}
	return float64(failed) > math.Floor(m.Settings.FailurePercent/100*float64(n)+1e-9)
}

// observe moves the wave's boxes along by what is seen of them.
func (m *Machine) observe(now time.Time, wave []*Box, seen Look) {
	set := func(b *Box, p Phase, reason string) {
		if b.Phase != p {
			b.Phase, b.Since = p, now
		}
		b.Reason = reason
	}
	for _, b := range wave {
		s, heard := seen(b.ID)
		switch b.Phase {
		case Updating:
			switch {
			case heard && s.Failure != "":
				set(b, Failed, s.Failure)
			case heard && s.Runs == m.B && s.Healthy:
				set(b, Gating, "")
			case s.Locked:
				// Waiting for its own lock: its time runs from when the
				// lock goes.
				b.Since, b.Reason = now, s.Hold
			case now.Sub(b.Since) >= m.Settings.BoxTimeout:
				set(b, Failed, "timeout")
			}
		case Gating:
			switch {
			case !heard:
				// Not heard of now (a report still on its way): judged
				// when it is, not failed for silence.
			case s.Failure != "":
				set(b, Failed, s.Failure)
			case s.Runs != m.B || !s.Healthy:
				set(b, Failed, "probe")
			case now.Sub(b.Since) >= m.Settings.Gate:
				set(b, Done, "")
			}
		}
	}
}

// start tells as many of the wave's waiting or held boxes to update as
// their sites allow, and notes why the others wait.
func (m *Machine) start(now time.Time, r *Region, wave []*Box, seen Look) []string {
	busy := map[string]int{}
	for _, b := range r.Boxes {
		switch {
		case b.Phase == Updating:
			busy[b.Site]++
		case b.Phase == Failed && b.Reverted && now.Sub(b.Since) < m.Settings.BoxTimeout:
			// On its way back to A: down until it runs A again (or,
			// if it never does, for a box's timeout).
			if s, heard := seen(b.ID); !heard || s.Runs != m.A || !s.Healthy {
				busy[b.Site]++
			}
		}
	}
	var out []string
	for _, b := range wave {
		if b.Phase != Waiting && b.Phase != Held {
			continue
		}
		s, _ := seen(b.ID)
		switch {
		case s.Failure != "":
			// It cannot take B before it is told to: its pre-pull
			// failed. It stays on A, and counts against the wave.
			b.Phase, b.Reason, b.Since = Failed, s.Failure, now
		case s.Hold != "" && s.HoldFails != "" && b.Phase == Held && now.Sub(b.Since) >= m.Settings.BoxTimeout:
			b.Phase, b.Reason, b.Since = Failed, s.HoldFails, now
		case s.Hold != "":
			if b.Phase != Held {
				b.Since = now
			}
			b.Phase, b.Reason = Held, s.Hold
		case busy[b.Site] >= max(1, m.Settings.MaxUnavailable):
			if b.Phase != Held {
				b.Since = now
			}
			b.Phase, b.Reason = Held, fmt.Sprintf("site %s already has %d boxes updating", b.Site, busy[b.Site])
		default:
			b.Phase, b.Reason, b.Since = Updating, "", now
			busy[b.Site]++
			out = append(out, b.ID)
		}
	}
	return out
}
