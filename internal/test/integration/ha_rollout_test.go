//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestRolloutCarriesOnAfterItsLeaderIsKilled runs a rollout on the
// documented deployment (three console replicas as binaries on a
// three-member etcd cluster, HAProxy in front) and kills -9 the replica
// that leads the rollouts controller once the first wave is through.
//
//   - Another replica takes the lead when the dead one's lease ends, and
//     the rollout carries on from where it stood to its end, within 60 s
//     of the kill: every box runs the new release, the region is pinned
//     to it. The kill lands right after the controller stored the second
//     wave's box as updating, often after it pinned the box and before
//     it wrote the box's desired state: the new leader tells that box
//     at its first look, not the periodic app sync a minute later.
//   - No box is told twice, seen three ways: the audit log holds one pin
//     of each box to the new release, written by the rollout; each box's
//     desired state took one write during the rollout (its revision went
//     up by one, to the robot at the new release); and no agent replaced
//     its workload with the new release more than once.
//
// It logs how long after the kill the new leader was elected, first
// wrote the rollout (its first look), and first moved a box on.
func TestRolloutCarriesOnAfterItsLeaderIsKilled(t *testing.T) {
	require.Root(t, "the process driver runs workloads under users of their own")
	t.Parallel()
	ha := startReplicas(t, 3)
	admin := ha.admin
	const n = 6
	boxes := ha.enrollBoxesWithUIDs(t, n, "hro-box", 1_100_000)
	ids := make([]string, n)
	for i, b := range boxes {
		ids[i] = b.ID()
	}
	testenv.WaitFor(t, 60*time.Second, "every box online, each held by a replica", func() bool {
		_, ok := holders(t, admin, n)
		return ok
	})
	t.Cleanup(func() {
		if t.Failed() {
			for i, r := range ha.reps {
				t.Logf("replica %d, its leader and rollout lines:\n%s\n%s", i, grepLines(r.log(), "component=leader"), grepLines(r.log(), "component=rollout"))
			}
		}
	})

	if _, err := admin.CreateApp(ctx(t), "robot", ""); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1", "2"} {
		if _, err := admin.CreateRelease(ctx(t), "robot", api.ReleaseSpec{Version: v, Runtime: "process", Image: "/bin/sleep", Args: []string{"360" + v}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Deploy(ctx(t), "robot", "1", "region", "east"); err != nil {
		t.Fatal(err)
	}
	runAll := func(v string, within time.Duration) {
		t.Helper()
		testenv.WaitFor(t, within, "every box running robot "+v, func() bool {
			s, err := admin.AppStatus(ctx(t), "robot")
			if err != nil || len(s.Boxes) != n {
				return false
			}
			for _, b := range s.Boxes {
				if b.Phase != "Running" || b.RunningRelease != v {
					return false
				}
			}
			return true
		})
	}
	runAll("1", 60*time.Second)
	// Each box's desired revision before the rollout: the rollout is to
	// write each box's desired state once.
	before := map[string]uint64{}
	for _, id := range ids {
		st, err := admin.BoxState(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		before[id] = st.Revision
	}

	// The leader of the rollouts controller, by the replicas' logs.
	leader := -1
	testenv.WaitFor(t, 30*time.Second, "one replica leading the rollouts controller", func() bool {
		leader = -1
		for i, r := range ha.reps {
			if len(leadTimes(r.log())) > 0 {
				if leader >= 0 {
					t.Fatalf("replicas %d and %d both lead the rollouts controller", leader, i)
				}
				leader = i
			}
		}
		return leader >= 0
	})
	other := (leader + 1) % len(ha.reps) // a replica that lives on
	survivor := ha.direct[other]
	t.Logf("replica %d (%s) leads the rollouts controller", leader, ha.reps[leader].id(t))

	// Six boxes of one site, taken one at a time, in waves of 1, 1, 2
	// and 2 boxes, each box gated 3 s.
	ro, err := admin.CreateRollout(ctx(t), api.RolloutRequest{App: "robot", From: "1", To: "2", Regions: []string{"east"},
		Waves: []string{"1", "2", "4", "100%"}, Gate: "3s", BoxTimeout: "2m"})
	if err != nil {
		t.Fatal(err)
	}
	if ro.Progress.Total != n || len(ro.Groups) != 1 || ro.Groups[0].Waves != 4 {
		t.Fatalf("rollout planned as %+v", ro)
	}
	created := time.Now()

	// The first wave through, the leader dies.
	testenv.WaitFor(t, 60*time.Second, "the rollout's first wave through", func() bool {
		r, err := admin.Rollout(ctx(t), ro.ID)
		if err == nil && r.State != "running" {
			t.Fatalf("rollout %s before the kill: %s", r.State, r.Reason)
		}
		return err == nil && r.Groups[0].Wave >= 1
	})
	killed := time.Now()
	ha.reps[leader].stop(syscall.SIGKILL)
	atKill, err := survivor.Rollout(ctx(t), ro.ID)
	if err != nil {
		t.Fatal(err)
	}
	mark := rolloutMark(atKill)
	t.Logf("killed replica %d %v after the rollout was made; the rollout then: %s", leader, killed.Sub(created).Round(time.Millisecond), mark)
	if atKill.State != "running" || atKill.Groups[0].Wave < 1 || atKill.Groups[0].Wave >= atKill.Groups[0].Waves {
		t.Fatalf("the kill did not land mid-rollout: %s", mark)
	}
	// Where the kill landed for the boxes being told: the controller
	// stores a box as updating, then pins it (an audited write), then
	// writes its desired state.
	pinnedBefore := map[string]bool{}
	if entries, err := survivor.AuditQuery(ctx(t), api.AuditQuery{Limit: 1000, Target: "robot@2", Action: "app.deploy"}); err == nil {
		for _, e := range entries {
			if id, ok := strings.CutPrefix(e.Detail, "box "); ok && e.Time.Before(killed) {
				pinnedBefore[id] = true
			}
		}
	}
	for _, b := range atKill.Groups[0].Boxes {
		if b.Phase != "updating" {
			continue
		}
		st, err := survivor.BoxState(ctx(t), b.ID)
		if err != nil {
			t.Fatal(err)
		}
		told := st.Revision > before[b.ID]
		switch {
		case !pinnedBefore[b.ID]:
			t.Logf("box %s was updating at the kill, not yet pinned to 2", b.ID)
		case !told:
			t.Logf("box %s was updating at the kill, pinned to 2 but not yet told: its desired state was not written", b.ID)
		default:
			t.Logf("box %s was updating at the kill, pinned to 2 and told", b.ID)
		}
	}

	// Any write of the rollout since the kill is the new leader's: the
	// first is its first look (it stores where it took the rollout
	// over), the first that changes a box's phase or a wave moves the
	// rollout along.
	var acted, moved time.Time
	for acted.IsZero() || moved.IsZero() {
		r, err := survivor.Rollout(ctx(t), ro.ID)
		if err == nil && acted.IsZero() && !r.UpdatedAt.Equal(atKill.UpdatedAt) {
			acted = time.Now()
		}
		if err == nil && moved.IsZero() && rolloutMark(r) != mark {
			moved = time.Now()
			t.Logf("the rollout after the kill: %s", rolloutMark(r))
		}
		if time.Since(killed) > 60*time.Second && (acted.IsZero() || moved.IsZero()) {
			logRolloutBoxes(t, survivor, r)
			t.Fatalf("the rollout did not move in the 60 s after the kill: %s, updated at %s (%v)", rolloutMark(r), r.UpdatedAt.Format("15:04:05.000"), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var done api.Rollout
	testenv.WaitFor(t, 90*time.Second, "the rollout done", func() bool {
		var err error
		done, err = survivor.Rollout(ctx(t), ro.ID)
		if err == nil && (done.State == "stopped" || done.State == "aborted") {
			t.Fatalf("rollout %s: %s; %s", done.State, done.Reason, rolloutMark(done))
		}
		time.Sleep(100 * time.Millisecond)
		return err == nil && done.State == "done"
	})
	t.Logf("the rollout was done %v after the kill, %v after it was made", time.Since(killed).Round(100*time.Millisecond), time.Since(created).Round(100*time.Millisecond))

	// Who took the lead, and when, by the survivors' logs.
	newLeader, elected := -1, time.Time{}
	for i, r := range ha.reps {
		if i == leader {
			continue
		}
		for _, at := range leadTimes(r.log()) {
			if at.After(killed) {
				if newLeader >= 0 {
					t.Errorf("replicas %d and %d both took the lead of the rollouts controller after the kill", newLeader, i)
				}
				newLeader, elected = i, at
				break
			}
		}
	}
	if newLeader < 0 {
		t.Fatal("no replica logged that it leads the rollouts controller after the kill")
	}
	secs := func(at time.Time) string { return strconv.FormatFloat(at.Sub(killed).Seconds(), 'f', 1, 64) + " s" }
	t.Logf("replica %d took the lead of the rollouts controller %s after the kill; a new leader acted %s after the kill, and moved a box on %s after it",
		newLeader, secs(elected), secs(acted), secs(moved))

	// Every box runs 2, the region is pinned to it, and the rollout says
	// each box is done.
	runAll("2", 30*time.Second)
	var pins []api.Pin
	testenv.WaitFor(t, 15*time.Second, "the region's pin alone", func() bool {
		pins, err = admin.Pins(ctx(t), "robot")
		return err == nil && len(pins) == 1
	})
	if p := pins[0]; p.Scope != "region" || p.Target != "east" || p.Version != "2" {
		t.Errorf("pin after the rollout: %s %s @%s, want region east @2", p.Scope, p.Target, p.Version)
	}
	for _, b := range done.Groups[0].Boxes {
		if b.Phase != "done" || b.Reverted {
			t.Errorf("box %s in the rollout: %s (%s), reverted %v", b.ID, b.Phase, b.Reason, b.Reverted)
		}
	}

	// No box told twice (1): one pin of each box to 2 in the audit log,
	// by the rollout; some before the kill, the others after it.
	entries, err := admin.AuditQuery(ctx(t), api.AuditQuery{Limit: 1000, Target: "robot@2", Action: "app.deploy"})
	if err != nil {
		t.Fatal(err)
	}
	told := map[string]int{}
	var early, late []string
	for _, e := range entries {
		id, ok := strings.CutPrefix(e.Detail, "box ")
		if !ok {
			continue
		}
		if e.Actor != "rollout "+ro.ID {
			t.Errorf("box %s pinned to 2 by %s, not by the rollout", id, e.Actor)
		}
		told[id]++
		if e.Time.Before(killed) {
			early = append(early, id)
		} else {
			late = append(late, id)
		}
	}
	for _, id := range ids {
		if told[id] != 1 {
			t.Errorf("box %s: pinned to 2 %d times, want once", id, told[id])
		}
	}
	t.Logf("boxes pinned to 2 before the kill: %v; after it: %v", early, late)
	if len(early) == 0 || len(late) == 0 {
		t.Errorf("the kill was not mid-rollout: %d boxes pinned before it, %d after", len(early), len(late))
	}

	// (2): each box's desired state took one write, which put robot at 2.
	// (3): no agent replaced its robot with 2 twice.
	var seen []string
	for _, id := range ids {
		var st api.BoxState
		testenv.WaitFor(t, 30*time.Second, "box "+id+" to ack its desired state", func() bool {
			st, err = admin.BoxState(ctx(t), id)
			return err == nil && st.Acked == st.Revision
		})
		var release string
		var rev uint64
		for _, o := range st.Objects {
			if o.Kind == "Workload" && o.Name == "robot" {
				var w struct {
					Release string `json:"release"`
				}
				if err := json.Unmarshal(o.Spec, &w); err != nil {
					t.Fatalf("box %s: robot's spec %s: %v", id, o.Spec, err)
				}
				release, rev = w.Release, o.Revision
			}
		}
		if st.Revision != before[id]+1 || rev != st.Revision || release != "2" {
			t.Errorf("box %s: desired revision %d before the rollout, %d after; robot at release %q, revision %d: want one write, of release 2",
				id, before[id], st.Revision, release, rev)
		}
		replaced := 0
		for _, e := range st.Events {
			if e.Kind == "Workload" && e.Name == "robot" && e.Reason == "Replacing" && strings.HasPrefix(e.Message, "release 2 ") {
				replaced++
			}
		}
		if replaced > 1 {
			t.Errorf("box %s replaced its robot with release 2 %d times", id, replaced)
		}
		seen = append(seen, fmt.Sprintf("%s: desired revision %d to %d, robot replaced with 2 %d time(s)", id, before[id], st.Revision, replaced))
	}
	t.Logf("the boxes: %s", strings.Join(seen, "; "))
}

// logRolloutBoxes logs what the console knows of the boxes of rollout r
// that are updating: their pins to To in the audit log, their desired
// robot and what they report of it.
func logRolloutBoxes(t *testing.T, c *api.Client, r api.Rollout) {
	entries, err := c.AuditQuery(ctx(t), api.AuditQuery{Limit: 1000, Target: r.App + "@" + r.To})
	if err != nil {
		t.Logf("audit: %v", err)
	}
	for _, e := range entries {
		t.Logf("audit %s: %s %s %s %s", e.Time.Format("15:04:05.000"), e.Actor, e.Action, e.Target, e.Detail)
	}
	for _, g := range r.Groups {
		for _, b := range g.Boxes {
			if b.Phase != "updating" {
				continue
			}
			st, err := c.BoxState(ctx(t), b.ID)
			if err != nil {
				t.Logf("box %s: %v", b.ID, err)
				continue
			}
			t.Logf("box %s, updating since %s: desired revision %d, acked %d", b.ID, b.Since.Format("15:04:05.000"), st.Revision, st.Acked)
			for _, o := range st.Objects {
				t.Logf("  desired %s/%s at %d: %s", o.Kind, o.Name, o.Revision, o.Spec)
			}
			for _, s := range st.Statuses {
				t.Logf("  status %s/%s: observed %d, %s, release %s", s.Kind, s.Name, s.ObservedRevision, s.Phase, s.Release)
			}
		}
	}
}

var leadRE = regexp.MustCompile(`(?m)^time=(\S+) .*\bmsg=leading\b.*\bcontroller=rollouts\b`)

// leadTimes are the times a replica's log says it took the lead of the
// rollouts controller.
func leadTimes(log string) []time.Time {
	var out []time.Time
	for _, m := range leadRE.FindAllStringSubmatch(log, -1) {
		if at, err := time.Parse(time.RFC3339, m[1]); err == nil {
			out = append(out, at)
		}
	}
	return out
}

// rolloutMark is where a rollout stands: its state, each group's wave
// and each box's phase. It changes only when the controller moves the
// rollout along.
func rolloutMark(r api.Rollout) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, group %d", r.State, r.Group)
	for _, g := range r.Groups {
		fmt.Fprintf(&b, "; %s wave %d/%d:", g.Name, g.Wave, g.Waves)
		for _, x := range g.Boxes {
			fmt.Fprintf(&b, " %s=%s", x.ID, x.Phase)
		}
	}
	return b.String()
}
