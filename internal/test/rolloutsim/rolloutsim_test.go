//go:build linux

package rolloutsim_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/rolloutsim"
)

// TestRolloutSimulator rolls a release out over 1,000 simulated boxes
// (10 regions of 5 sites of 20; the real console and agents with the fake
// runtime) while 1 % of the boxes cannot run it, 3 % hold update locks
// for up to 20 s, two regions' maintenance window is closed for the
// first 15 s and the console is restarted twice. Then it checks:
//   - never more boxes of a site down at once than max unavailable;
//   - no box of a closed region, and no locked box, was told to move
//     before its window opened or its lock was released;
//   - every box ends on the new release, but the failing ones, which end
//     on the old one, or, if the rollout stopped, as its policy says;
//   - the audit log tells the same story: each box told to move once,
//     each box sent back once and only the failing ones.
//
// EDGEBOX_ROLLOUT_SIM_SEED picks another run; the seed is logged.
func TestRolloutSimulator(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("EDGEBOX_ROLLOUT_SIM_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (EDGEBOX_ROLLOUT_SIM_SEED)", seed)
	fp := 34.0
	cfg := rolloutsim.Config{Regions: 10, SitesPerRegion: 5, BoxesPerSite: 20, FailRate: 0.01, LockRate: 0.03,
		LockFor: 20 * time.Second, ClosedRegions: 2, OpenAfter: 15 * time.Second, Restarts: 2, Seed: seed,
		Rollout: api.RolloutRequest{Waves: []string{"2%", "10%", "50%", "100%"}, Gate: "0s", BoxTimeout: "2m",
			MaxUnavailable: 4, FailurePercent: &fp}}
	res := rolloutsim.Run(t, cfg)
	r := res.Rollout
	t.Logf("%d boxes, rollout %s in %s (%s); %d failing, %d locked; %d looks at the fleet",
		r.Progress.Total, r.State, res.Took.Round(time.Millisecond), r.Reason, len(res.Failing), len(res.LockedUntil), res.Samples)

	for site, n := range res.MaxDown {
		if n > cfg.Rollout.MaxUnavailable {
			t.Errorf("site %s had %d boxes down at once, more than %d", site, n, cfg.Rollout.MaxUnavailable)
		}
	}
	// The audit log: the rollout's own pins, box by box.
	actor := "rollout " + r.ID
	toldAt := map[string]time.Time{}
	told, back := map[string]int{}, map[string]int{}
	for _, e := range res.Audit {
		if e.Actor != actor || e.Action != "app.deploy" {
			continue
		}
		id, ok := strings.CutPrefix(e.Detail, "box ")
		if !ok {
			continue
		}
		switch e.Target {
		case "robot@2":
			told[id]++
			toldAt[id] = e.Time
		case "robot@1":
			back[id]++
		}
	}
	for id, at := range toldAt {
		if open, ok := res.ClosedUntil[res.Region[id]]; ok && at.Before(open) {
			t.Errorf("box %s of region %s was told to move at %s, before its window opened at %s", id, res.Region[id], at, open)
		}
		if until, ok := res.LockedUntil[id]; ok && at.Before(until) {
			t.Errorf("box %s was told to move at %s while its workload held an update lock (released at %s)", id, at, until)
		}
	}
	moved := 0
	for id := range res.Region {
		if told[id] > 1 || back[id] > 1 {
			t.Errorf("box %s was told to move %d times and sent back %d times", id, told[id], back[id])
		}
		if told[id] > 0 {
			moved++
		}
		switch {
		case res.Failing[id] && told[id] > 0 && (back[id] != 1 || res.Final[id] != "1"):
			t.Errorf("failing box %s: sent back %d times, ends on %s", id, back[id], res.Final[id])
		case !res.Failing[id] && back[id] > 0:
			t.Errorf("box %s, which runs 2 well, was sent back: %s", id, phaseOf(r, id))
		case r.State == "done" && !res.Failing[id] && res.Final[id] != "2":
			t.Errorf("box %s ends on %s after the rollout is done", id, res.Final[id])
		case r.State == "stopped" && told[id] == 0 && res.Final[id] != "1":
			t.Errorf("box %s, never told to move, ends on %s", id, res.Final[id])
		case r.State == "stopped" && told[id] > 0 && !res.Failing[id] && res.Final[id] != "2":
			t.Errorf("box %s moved and ran well, yet ends on %s after the stop", id, res.Final[id])
		}
	}
	if r.State == "done" && moved != len(res.Region) {
		t.Errorf("the rollout is done, yet %d of its %d boxes were told to move", moved, len(res.Region))
	}
	if r.State != "done" && r.State != "stopped" {
		t.Errorf("rollout %s: %s", r.State, r.Reason)
	}
}

// phaseOf says where box id stands in rollout r.
func phaseOf(r api.Rollout, id string) string {
	for _, g := range r.Groups {
		for _, b := range g.Boxes {
			if b.ID == id {
				return fmt.Sprintf("%s in wave %d of %s: %s", b.Phase, b.Wave+1, g.Name, b.Reason)
			}
		}
	}
	return "not in the rollout"
}
