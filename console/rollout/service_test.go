package rollout

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/opencontainers/go-digest"
)

// env is the console's part of a rollout over a real store, with boxes
// that report what their desired state says as an agent would: a
// workload runs the release it is told, healthy, unless told to fail.
type env struct {
	t       testing.TB
	ctx     context.Context
	st      store.Store
	fl      *fleet.Fleet
	apps    *apps.Apps
	desired *desired.State
	now     time.Time
	svc     *Service
	op      audit.Actor
	boxes   []fleet.Box
	// fail names boxes that fail release "2" and how ("PullFailed").
	fail    map[string]string
	offline map[string]bool
	// pulling names boxes whose pre-pull goes on; prefail those whose
	// pre-pull fails; locked those where a workload holds an update lock.
	pulling, prefail, locked map[string]bool
	// lineDown names offline boxes whose site hears them running.
	lineDown map[string]bool
	// stalled boxes take their time to act on release 2.
	stalled map[string]bool
	// ticking is the time spent in the controller's ticks.
	ticking time.Duration
}

// images stands in for the console's registry: every tag resolves.
type images struct{}

func (images) Resolve(_ context.Context, repo, tag string) (digest.Digest, error) {
	return digest.FromString(repo + ":" + tag), nil
}
func (images) HasManifest(context.Context, string, digest.Digest) (bool, error) { return true, nil }

func newEnv(t testing.TB, regions map[string]int) *env { return newEnvOn(t, "process", regions) }

// newEnvOn is newEnv with releases for runtime rt: "containerd" ones
// have images to pre-pull.
func newEnvOn(t testing.TB, rt string, regions map[string]int) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{t: t, ctx: ctx, st: storetest.Bolt(t), now: time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC),
		op: audit.Actor{TenantID: "bank", Name: "alice"}, fail: map[string]string{}, offline: map[string]bool{},
		pulling: map[string]bool{}, prefail: map[string]bool{}, locked: map[string]bool{}, stalled: map[string]bool{}, lineDown: map[string]bool{}}
	var err error
	if e.fl, err = fleet.New(ctx, e.st, func() time.Time { return e.now }); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e.desired = desired.New(e.st)
	e.apps = apps.New(e.st, e.desired, e.fl, images{}, []string{"console.test"}, nil, log)
	for _, region := range slices.Sorted(maps.Keys(regions)) {
		for i := range regions[region] {
			site := fmt.Sprintf("%s-site-%d", region, i%3)
			tok, _, err := e.fl.CreateToken(ctx, e.op, fleet.TokenSpec{Region: region, Site: site, TTL: time.Hour, Uses: 1},
				"https://127.0.0.1:8443", sha256.Sum256([]byte("ca")), [32]byte{})
			if err != nil {
				t.Fatal(err)
			}
			b, _, err := e.fl.Enroll(ctx, fleet.Enrollment{Token: tok, Hostname: "h", Name: fmt.Sprintf("%s-%02d", region, i),
				Issue: func(string) ([]byte, time.Time, error) { return []byte("cert"), e.now.Add(time.Hour), nil }})
			if err != nil {
				t.Fatal(err)
			}
			if b, err = e.fl.ReportFacts(ctx, b.ID, fleet.Facts{Capability: 2}, e.now); err != nil {
				t.Fatal(err)
			}
			e.boxes = append(e.boxes, b)
		}
	}
	if _, err := e.apps.CreateApp(ctx, e.op, "robot", ""); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1", "2"} {
		spec := apps.Spec{Version: v, Runtime: rt, Image: "/bin/sleep"}
		if rt == "containerd" {
			spec.Image = "console.test/bank/robot:" + v
		}
		if _, err := e.apps.CreateRelease(ctx, e.op, "robot", spec); err != nil {
			t.Fatal(err)
		}
	}
	for region := range regions {
		if _, _, err := e.apps.Deploy(ctx, e.op, "robot", "1", apps.ScopeRegion, region); err != nil {
			t.Fatal(err)
		}
	}
	e.restart()
	e.report()
	return e
}

// restart is a console started again: a new Service over the same store.
func (e *env) restart() {
	e.svc = New(Config{Store: e.st, Apps: e.apps, Boxes: e.fl, Desired: e.desired, Now: func() time.Time { return e.now },
		Online: func(id string) bool { return !e.offline[id] }, LineDown: func(id string) bool { return e.lineDown[id] },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// report has every online box report its robot workload as an agent
// would after acting on its desired state.
func (e *env) report() {
	e.t.Helper()
	for _, b := range e.boxes {
		if e.offline[b.ID] {
			continue
		}
		live, _, err := e.desired.Live(e.ctx, b.ID)
		if err != nil {
			e.t.Fatal(err)
		}
		var report []*edgeboxv1.ObjectStatus
		if e.locked[b.ID] {
			report = append(report, &edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindUpdateLock, Name: "robot", Phase: edgeboxv1.PhaseRunning, Message: "signing a payment"})
		}
		for _, o := range live {
			if p := o.GetImagePrefetch(); p != nil {
				s := &edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindImagePrefetch, Name: o.GetName(), ObservedRevision: o.GetRevision(), Phase: edgeboxv1.PhaseRunning}
				switch {
				case e.prefail[b.ID]:
					s.Phase, s.Reason, s.Message = edgeboxv1.PhaseFailed, edgeboxv1.ReasonPullFailed, "manifest unknown"
				case e.pulling[b.ID]:
					s.Phase, s.Message = edgeboxv1.PhasePulling, "pulling: 40 %"
				}
				report = append(report, s)
			}
			w := o.GetWorkload()
			if w == nil {
				continue
			}
			s := &edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindWorkload, Name: o.GetName(), ObservedRevision: o.GetRevision(),
				Phase: edgeboxv1.PhaseRunning, Release: w.GetRelease()}
			if e.stalled[b.ID] && w.GetRelease() == "2" {
				s.Phase, s.Release, s.Message = edgeboxv1.PhasePending, "1", "pulling"
			}
			if e.locked[b.ID] && w.GetRelease() == "2" {
				// The agent replaces nothing while a lock holds the box.
				s.Phase, s.Release, s.Message = edgeboxv1.PhasePending, "1", "release 2 waits: update lock held by robot"
			}
			if why := e.fail[b.ID]; why != "" && w.GetRelease() == "2" {
				s.Phase, s.Reason, s.Message, s.Release = edgeboxv1.PhaseFailed, why, "it went wrong", "1"
			}
			report = append(report, s)
		}
		if err := e.desired.ReportStatus(e.ctx, b.ID, &edgeboxv1.SyncStatus{Objects: report, Full: true}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// step is one controller tick a minute after the last, the boxes then
// reporting.
func (e *env) step() { e.stepBy(time.Minute) }

// stepBy is one controller tick d after the last, the boxes then
// reporting.
func (e *env) stepBy(d time.Duration) {
	e.t.Helper()
	e.now = e.now.Add(d)
	t0 := time.Now()
	if err := e.svc.TickAll(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.ticking += time.Since(t0)
	e.report()
}

func (e *env) get(id string) Rollout {
	e.t.Helper()
	r, err := e.svc.Get(e.ctx, "bank", id)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// runs is the release each box should run now, by box ID.
func (e *env) runs() map[string]string {
	e.t.Helper()
	v, err := e.apps.Versions(e.ctx, "bank", "robot", e.boxes)
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

// told counts, per box, the deploys of release v pinned on it alone.
func (e *env) told(v string) map[string]int {
	e.t.Helper()
	entries, err := audit.New(e.st, nil).List(e.ctx, audit.Query{TenantID: "bank", Limit: 10000})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int{}
	for _, en := range entries {
		if en.Action == "app.deploy" && en.Target == "robot@"+v && strings.HasPrefix(en.Detail, "box ") {
			out[strings.TrimPrefix(en.Detail, "box ")]++
		}
	}
	return out
}

func TestRolloutOverTwoRegions(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 6, "east": 12})
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2",
		Scope: Scope{Regions: []string{"north", "east"}}, Settings: Settings{Gate: 2 * time.Minute, MaxUnavailable: 2, FailurePercent: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if r.State != Running || len(r.Machine.Regions) != 2 || r.Machine.Regions[0].Name != "north" {
		t.Fatalf("created: %s, %d groups", r.State, len(r.Machine.Regions))
	}
	// North's waves are 1, 1 (10 % of 6 rounds up to 1, no new box: left
	// out), 3 and 6 boxes; east does not move while north goes.
	var order []string
	firstEast := -1
	for i := 0; i < 200 && !e.get(r.ID).State.over(); i++ {
		if i == 17 {
			e.restart() // a console started again carries on
		}
		e.step()
		runs := e.runs()
		for _, b := range e.boxes {
			if runs[b.ID] == "2" && !contains(order, b.ID) {
				order = append(order, b.ID)
				if b.Region == "east" && firstEast < 0 {
					firstEast = len(order) - 1
				}
			}
		}
	}
	r = e.get(r.ID)
	if r.State != Finished {
		t.Fatalf("rollout %s: %s", r.State, r.Reason)
	}
	if firstEast != 6 {
		t.Errorf("east's first box moved as box %d of the order, want after north's 6: %v", firstEast+1, order)
	}
	runs := e.runs()
	for _, b := range e.boxes {
		if runs[b.ID] != "2" {
			t.Errorf("box %s runs %q, want 2", b.ID, runs[b.ID])
		}
	}
	pins, _ := e.apps.Pins(e.ctx, "bank", "robot")
	for _, p := range pins {
		if p.Scope != apps.ScopeRegion || p.Version != "2" {
			t.Errorf("pin left: %s %s @%s", p.Scope, p.Target, p.Version)
		}
	}
	for id, n := range e.told("2") {
		if n != 1 {
			t.Errorf("box %s was told to run 2 %d times", id, n)
		}
	}
	if active, _ := e.svc.active(e.ctx, ""); len(active) != 0 {
		t.Errorf("%d rollouts still on the controller's list", len(active))
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestRolloutStopsAtTheFirstWaveFailure(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 5})
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2",
		Scope: Scope{Regions: []string{"north"}}, Settings: Settings{Gate: time.Minute, FailurePercent: 10}})
	if err != nil {
		t.Fatal(err)
	}
	first := r.Machine.Regions[0].Boxes[0].ID
	e.fail[first] = edgeboxv1.ReasonPullFailed
	for i := 0; i < 20 && !e.get(r.ID).State.over(); i++ {
		e.step()
	}
	r = e.get(r.ID)
	if r.State != Stopped {
		t.Fatalf("rollout %s, want stopped", r.State)
	}
	b := r.Machine.Regions[0].Boxes[0]
	if b.Phase != Failed || !strings.HasPrefix(b.Reason, "pull: ") || !b.Reverted {
		t.Errorf("first box: %s %q reverted=%t", b.Phase, b.Reason, b.Reverted)
	}
	runs := e.runs()
	for _, bx := range e.boxes {
		if runs[bx.ID] != "1" {
			t.Errorf("box %s runs %s after the stop", bx.ID, runs[bx.ID])
		}
	}
	if n := len(e.told("2")); n != 1 {
		t.Errorf("%d boxes were told to run 2, want the first alone", n)
	}
}

func TestRolloutWaitsForWindowsOfflineBoxesAndApprovals(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 3})
	// North's boxes may update only 22:00–06:00 in Shanghai (14:00–22:00
	// UTC); it is 09:00 UTC.
	if _, err := e.svc.SetRules(e.ctx, e.op, Rules{ApproveStart: true, ApproveFirstWave: true,
		Regions: map[string]Policy{"north": {Zone: "Asia/Shanghai", Allow: []Window{{Days: EveryDay, From: "22:00", To: "06:00"}}}}}); err != nil {
		t.Fatal(err)
	}
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r.State != AwaitingApproval {
		t.Fatalf("state %s, want awaiting approval", r.State)
	}
	if _, err := e.svc.Approve(e.ctx, e.op, r.ID); errdefs.Kind(err) != errdefs.ErrPermission {
		t.Errorf("its creator approved it: %v", err)
	}
	e.step()
	if got := e.get(r.ID); got.Machine.Regions[0].Boxes[0].Phase != Waiting {
		t.Errorf("a box moved before the approval: %s", got.Machine.Regions[0].Boxes[0].Phase)
	}
	bob := audit.Actor{TenantID: "bank", Name: "bob"}
	if _, err := e.svc.Approve(e.ctx, bob, r.ID); err != nil {
		t.Fatal(err)
	}
	e.step()
	b := e.get(r.ID).Machine.Regions[0].Boxes[0]
	if b.Phase != Held || !strings.Contains(b.Reason, "maintenance window") {
		t.Fatalf("first box in a closed window: %s %q", b.Phase, b.Reason)
	}
	e.now = time.Date(2026, 11, 24, 14, 30, 0, 0, time.UTC) // 22:30 in Shanghai
	e.offline[b.ID] = true
	e.step()
	if b := e.get(r.ID).Machine.Regions[0].Boxes[0]; b.Phase != Held || b.Reason != "the box is offline" {
		t.Fatalf("offline box: %s %q", b.Phase, b.Reason)
	}
	delete(e.offline, b.ID)
	for i := 0; i < 10 && e.get(r.ID).State == Running; i++ {
		e.step()
	}
	if got := e.get(r.ID); got.State != AwaitingApproval || !got.Machine.AwaitsApproval() {
		t.Fatalf("after the first wave: %s %q", got.State, got.Reason)
	}
	if _, err := e.svc.Approve(e.ctx, bob, r.ID); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20 && !e.get(r.ID).State.over(); i++ {
		e.step()
	}
	if got := e.get(r.ID); got.State != Finished || len(got.Approvals) != 2 {
		t.Fatalf("rollout %s %q, %d approvals", got.State, got.Reason, len(got.Approvals))
	}
}

// TestABoxWhoseLineIsDownIsNeitherFailedNorTouched: a box whose line
// goes down while it updates is not failed however long it is away, and
// one whose line is down when its wave comes is not told to update; both
// are once they are back, and the rollout finishes.
func TestABoxWhoseLineIsDownIsNeitherFailedNorTouched(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 3})
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north"}},
		Settings: Settings{Gate: 2 * time.Minute, BoxTimeout: 10 * time.Minute, Waves: []Size{{Boxes: 1}, {Percent: 100}}}})
	if err != nil {
		t.Fatal(err)
	}
	first := e.get(r.ID).Machine.Regions[0].Boxes[0].ID
	var later string
	for _, b := range e.boxes {
		if b.ID != first {
			later = b.ID
			break
		}
	}
	// The second wave's box loses its line before its wave; the first
	// loses it once told to update, before it says it runs 2.
	e.offline[later], e.lineDown[later] = true, true
	e.stalled[first] = true
	e.step()
	if b := e.get(r.ID).Machine.Regions[0].Boxes[0]; b.Phase != Updating {
		t.Fatalf("the first box: %s %q", b.Phase, b.Reason)
	}
	e.offline[first], e.lineDown[first] = true, true
	for range 60 { // an hour, six box timeouts
		e.step()
	}
	got := e.get(r.ID)
	if got.State != Running {
		t.Fatalf("the rollout is %s: %s", got.State, got.Reason)
	}
	for _, b := range got.Machine.Regions[0].Boxes {
		if b.Phase == Failed {
			t.Errorf("box %s failed while its line was down: %s", b.ID, b.Reason)
		}
		if b.ID == first && !strings.Contains(b.Reason, "line is down") {
			t.Errorf("the first box waits for %q", b.Reason)
		}
	}
	if n := e.told("2")[later]; n != 0 {
		t.Errorf("a box whose line is down was told to update %d times", n)
	}
	delete(e.offline, first)
	delete(e.offline, later)
	delete(e.stalled, first)
	e.lineDown = map[string]bool{}
	for i := 0; i < 30 && !e.get(r.ID).State.over(); i++ {
		e.step()
	}
	if got := e.get(r.ID); got.State != Finished {
		t.Fatalf("once the lines were back, the rollout is %s: %s", got.State, got.Reason)
	}
}

func TestRolloutRequestsRefused(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 2, "east": 2})
	ok := Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north"}}}
	if _, err := e.svc.Create(e.ctx, e.op, ok); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		q    Request
		want string
	}{
		"empty scope":   {Request{App: "robot", From: "1", To: "2"}, "exactly one"},
		"two scopes":    {Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"east"}, Site: "x"}}, "exactly one"},
		"unknown app":   {Request{App: "nope", From: "1", To: "2", Scope: Scope{Regions: []string{"east"}}}, "nope"},
		"unknown to":    {Request{App: "robot", From: "1", To: "9", Scope: Scope{Regions: []string{"east"}}}, "9"},
		"same release":  {Request{App: "robot", From: "1", To: "1", Scope: Scope{Regions: []string{"east"}}}, "nothing to move"},
		"no such place": {Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"west"}}}, "has no boxes"},
		"overlap":       {ok, "already moves box"},
		"nobody on A":   {Request{App: "robot", From: "2", To: "1", Scope: Scope{Regions: []string{"east"}}}, "nothing to move"},
		"huge waves":    {Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"east"}}, Settings: Settings{Waves: make([]Size, 50)}}, "waves"},
		"odd wave":      {Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"east"}}, Settings: Settings{Waves: []Size{{Percent: 300}}}}, "share"},
		"long gate":     {Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"east"}}, Settings: Settings{Gate: 30 * 24 * time.Hour}}, "gate"},
		"twice named":   {Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"east", "east"}}}, "twice"},
	} {
		if _, err := e.svc.Create(e.ctx, e.op, tc.q); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
	never := Rules{Regions: map[string]Policy{"east": {Zone: "UTC", Allow: []Window{{Days: Holidays, From: "01:00", To: "02:00"}},
		Deny: []Window{{Days: EveryDay, From: "00:00", To: "24:00"}}}}}
	if _, err := e.svc.SetRules(e.ctx, e.op, never); err == nil || !strings.Contains(err.Error(), "never") {
		t.Errorf("a policy that never opens: %v", err)
	}
}

// TestRolloutPrePullsAndWaitsForLocks: every box is asked to pre-pull
// the new image first; a box still pulling, or where a workload holds an
// update lock, is held back and says why; a box whose pre-pull fails
// fails its wave without being told to move; the pre-pulls are taken
// back at the end.
func TestRolloutPrePullsAndWaitsForLocks(t *testing.T) {
	e := newEnvOn(t, "containerd", map[string]int{"north": 4})
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north"}},
		Settings: Settings{Waves: []Size{{Boxes: 1}, {Percent: 100}}, MaxUnavailable: 4, FailurePercent: 50}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Prefetch == nil || !strings.HasSuffix(r.Prefetch.Image, "@"+digest.FromString("bank/robot:2").String()) {
		t.Fatalf("prefetch: %+v", r.Prefetch)
	}
	boxes := r.Machine.Regions[0].Boxes
	first, locked, broken := boxes[0].ID, boxes[1].ID, boxes[2].ID
	e.pulling[first], e.locked[locked], e.prefail[broken] = true, true, true
	e.step()
	e.step()
	got := e.get(r.ID)
	if p := got.Prefetch; !p.Placed || p.Asked != 4 || p.OnDisk != 2 || p.Failed != 1 {
		t.Fatalf("prefetch after a tick: %+v", p)
	}
	if b := got.Machine.Regions[0].Boxes[0]; b.Phase != Held || !strings.HasPrefix(b.Reason, "pre-pulling 2: pulling: 40 %") {
		t.Fatalf("first box while its pull goes on: %s %q", b.Phase, b.Reason)
	}
	delete(e.pulling, first)
	for i := 0; i < 10 && e.get(r.ID).Machine.Regions[0].Wave == 0; i++ {
		e.step()
	}
	e.step()
	got = e.get(r.ID)
	for _, b := range got.Machine.Regions[0].Boxes {
		switch b.ID {
		case locked:
			if b.Phase != Held || b.Reason != "update lock held by robot: signing a payment" {
				t.Errorf("locked box: %s %q", b.Phase, b.Reason)
			}
		case broken:
			if b.Phase != Held || !strings.HasPrefix(b.Reason, "pre-pull of 2 failed, trying again: manifest unknown") {
				t.Errorf("box whose pre-pull failed: %s %q", b.Phase, b.Reason)
			}
		}
	}
	if n := e.told("2")[broken]; n != 0 {
		t.Errorf("the box whose pre-pull failed was told to move %d times", n)
	}
	delete(e.locked, locked)
	for i := 0; i < 30 && !e.get(r.ID).State.over(); i++ {
		e.step()
	}
	got = e.get(r.ID)
	// A pre-pull that keeps failing for a box's timeout fails the box.
	if b := got.Machine.Regions[0].Boxes[2]; b.Phase != Failed || b.Reason != "pull: manifest unknown" {
		t.Errorf("box whose pre-pull kept failing: %s %q", b.Phase, b.Reason)
	}
	if got.State != Finished || got.Prefetch.Placed {
		t.Fatalf("rollout %s %q, prefetch %+v", got.State, got.Reason, got.Prefetch)
	}
	if e.runs()[broken] != "1" || e.runs()[locked] != "2" {
		t.Errorf("broken box runs %s, locked box %s", e.runs()[broken], e.runs()[locked])
	}
	for _, b := range e.boxes {
		live, _, _ := e.desired.Live(e.ctx, b.ID)
		for _, o := range live {
			if o.GetImagePrefetch() != nil {
				t.Errorf("box %s keeps its pre-pull", b.ID)
			}
		}
	}
}

// BenchmarkNationalPush is a national push in simulated time: 10 regions
// of 100 boxes (3 sites each), one after another, waves 1, 10 %, 50 %,
// 100 %, 5-minute gates, 10 boxes of a site at once, the controller
// ticking every 30 s and every box taking the new release at once. It
// reports the push's total and how long each region waited for those
// before it.
//
//	go test -run '^$' -bench NationalPush -benchtime 1x ./console/rollout/
func BenchmarkNationalPush(b *testing.B) {
	regions := map[string]int{}
	for i := range 10 {
		regions[fmt.Sprintf("r%02d", i)] = 100
	}
	for range b.N {
		e := newEnv(b, regions)
		start := e.now
		r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: slices.Sorted(maps.Keys(regions))},
			Settings: Settings{Gate: 5 * time.Minute, MaxUnavailable: 10, FailurePercent: 10}})
		if err != nil {
			b.Fatal(err)
		}
		began := map[string]time.Duration{}
		ticks := 0
		for ; !e.get(r.ID).State.over(); ticks++ {
			e.stepBy(30 * time.Second)
			for _, g := range e.get(r.ID).Machine.Regions {
				if _, ok := began[g.Name]; !ok && slices.ContainsFunc(g.Boxes, func(x *Box) bool { return x.Phase != Waiting }) {
					began[g.Name] = e.now.Sub(start)
				}
			}
		}
		total := e.now.Sub(start)
		if got := e.get(r.ID); got.State != Finished {
			b.Fatalf("push %s: %s", got.State, got.Reason)
		}
		b.ReportMetric(total.Minutes(), "sim-min")
		b.ReportMetric(float64(ticks), "ticks")
		b.ReportMetric(float64(e.ticking.Milliseconds())/float64(ticks), "ms/tick")
		var waits []string
		for _, name := range slices.Sorted(maps.Keys(began)) {
			waits = append(waits, fmt.Sprintf("%s +%s", name, began[name]))
		}
		b.Logf("1,000 boxes in 10 regions: all on the new release after %s simulated (%d ticks, the controller %.1f ms a tick); each region began at %s",
			total, ticks, float64(e.ticking.Microseconds())/1000/float64(ticks), strings.Join(waits, ", "))
	}
}

// TestALockTakenMidUpdateIsWaitedFor: a box told to update whose workload
// then takes a lock waits, past its timeout, and moves once the lock goes.
func TestALockTakenMidUpdateIsWaitedFor(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 2})
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north"}},
		Settings: Settings{BoxTimeout: 5 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	first := r.Machine.Regions[0].Boxes[0].ID
	e.locked[first] = true
	for range 12 { // 12 min: past the box's 5 min
		e.step()
	}
	b := e.get(r.ID).Machine.Regions[0].Boxes[0]
	if b.Phase != Updating || !strings.Contains(b.Reason, "update lock held by robot") {
		t.Fatalf("a box waiting on its lock: %s %q", b.Phase, b.Reason)
	}
	delete(e.locked, first)
	for i := 0; i < 20 && !e.get(r.ID).State.over(); i++ {
		e.step()
	}
	if got := e.get(r.ID); got.State != Finished {
		t.Fatalf("rollout %s: %s", got.State, got.Reason)
	}
}

// TestARegionIsPinnedWholeOnlyIfThatMovesNoOneElse: a region under which
// a site pin of the app lies keeps its boxes' own pins at the end, so the
// site's boxes do not fall back to the site's pin; one whose boxes all
// took part gets the region pin.
func TestARegionIsPinnedWholeOnlyIfThatMovesNoOneElse(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 3, "east": 3})
	if _, _, err := e.apps.Deploy(e.ctx, e.op, "robot", "1", apps.ScopeSite, "north-site-0"); err != nil {
		t.Fatal(err)
	}
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north", "east"}},
		Settings: Settings{MaxUnavailable: 3}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40 && !e.get(r.ID).State.over(); i++ {
		e.step()
	}
	if got := e.get(r.ID); got.State != Finished {
		t.Fatalf("rollout %s: %s", got.State, got.Reason)
	}
	for id, v := range e.runs() {
		if v != "2" {
			t.Errorf("box %s runs %s after the rollout", id, v)
		}
	}
	pins, _ := e.apps.Pins(e.ctx, "bank", "robot")
	got := map[string]string{}
	for _, p := range pins {
		got[p.Scope+"/"+p.Target] = p.Version
	}
	if got["region/north"] != "1" || got["region/east"] != "2" {
		t.Errorf("pins: %v; want north's region pin left alone (a site pin lies under it), east's moved", got)
	}
	boxPins := 0
	for k, v := range got {
		if strings.HasPrefix(k, "box/") {
			boxPins++
			if v != "2" {
				t.Errorf("pin %s @%s", k, v)
			}
		}
	}
	if boxPins != 3 {
		t.Errorf("%d box pins, want north's 3 kept: %v", boxPins, got)
	}
}

// TestTimeTheConsoleWasDownDoesNotTimeBoxesOut: a box updating when the
// console stops is not failed for the time the console was down; it
// still is for time watched.
func TestTimeTheConsoleWasDownDoesNotTimeBoxesOut(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 2})
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north"}},
		Settings: Settings{BoxTimeout: 10 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	first := r.Machine.Regions[0].Boxes[0].ID
	e.stalled[first] = true
	for range 4 {
		e.step() // 4 min watched
	}
	e.now = e.now.Add(time.Hour) // the console is down for an hour
	e.restart()
	e.step()
	if b := e.get(r.ID).Machine.Regions[0].Boxes[0]; b.Phase != Updating {
		t.Fatalf("after the console's hour down: %s %q", b.Phase, b.Reason)
	}
	for range 7 {
		e.step() // 3 + 7 min watched: its 10 min
	}
	if b := e.get(r.ID).Machine.Regions[0].Boxes[0]; b.Phase != Failed || b.Reason != "timeout" {
		t.Fatalf("after 10 min watched: %s %q", b.Phase, b.Reason)
	}
}

// TestAPausedRolloutStillWatchesItsBoxes: paused, a rollout starts no box,
// but a box already told that fails goes back at once.
func TestAPausedRolloutStillWatchesItsBoxes(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 5})
	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north"}},
		Settings: Settings{Waves: []Size{{Boxes: 1}, {Percent: 100}}, MaxUnavailable: 1, FailurePercent: 100, Gate: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	boxes := r.Machine.Regions[0].Boxes
	for _, b := range boxes[1:] {
		e.stalled[b.ID] = true
	}
	phase := func(i int) Phase { return e.get(r.ID).Machine.Regions[0].Boxes[i].Phase }
	for i := 0; i < 10 && phase(1) != Updating; i++ {
		e.step()
	}
	if phase(1) != Updating || phase(4) != Held {
		t.Fatalf("the second wave: %s and %s", phase(1), phase(4))
	}
	if _, err := e.svc.Pause(e.ctx, e.op, r.ID, ""); err != nil {
		t.Fatal(err)
	}
	delete(e.stalled, boxes[1].ID)
	e.fail[boxes[1].ID] = edgeboxv1.ReasonStartFailed
	for range 3 {
		e.step()
	}
	got := e.get(r.ID)
	if b := got.Machine.Regions[0].Boxes[1]; b.Phase != Failed || !b.Reverted || got.State != Paused {
		t.Fatalf("paused, the failed box: %s reverted=%t, rollout %s", b.Phase, b.Reverted, got.State)
	}
	if e.runs()[boxes[1].ID] != "1" {
		t.Errorf("the failed box runs %s", e.runs()[boxes[1].ID])
	}
	if n := e.told("2")[boxes[4].ID]; n != 0 || phase(4) == Updating {
		t.Errorf("a box was told to move while the rollout was paused")
	}
}
