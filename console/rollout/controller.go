package rollout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"google.golang.org/protobuf/proto"
)

// Run moves the rollouts along until ctx ends, and returns nil then. A
// rollout whose tick failed is logged and tried again at the next one.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.TickAll(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("rollouts", "err", err)
		}
	}
}

// TickAll moves every rollout the controller has work for along once,
// and keeps where each stands for the metrics.
func (s *Service) TickAll(ctx context.Context) error {
	active, err := s.active(ctx, "")
	if err != nil {
		return err
	}
	var errs []error
	seen := make([]progress, 0, len(active))
	for _, r := range active {
		after, err := s.tick(ctx, r.TenantID, r.ID)
		if err != nil {
			errs = append(errs, fmt.Errorf("rollout %s: %w", r.ID, err))
			after = r // as it stood before the tick
		}
		seen = append(seen, progressOf(after))
	}
	s.mu.Lock()
	s.progress = seen
	s.mu.Unlock()
	return errors.Join(errs...)
}

// actor is who a rollout's own changes are audited as.
func actor(r Rollout) audit.Actor {
	return audit.Actor{TenantID: r.TenantID, Name: "rollout " + r.ID}
}

// tick steps one rollout: the machine decides from what the boxes
// report, the decision is stored, and then the pins are made to say what
// the stored rollout says. Storing first and pinning after, from the
// stored state alone, is what makes a console killed at any point carry
// on with no box told twice: the next tick writes the pins still missing
// and none that are there, and a console's first tick tells the boxes
// on their way what pins already there say, if they were not told yet
// (ensurePins). It returns the rollout as the tick left it.
func (s *Service) tick(ctx context.Context, tenant, id string) (Rollout, error) {
	r, rev, err := s.get(ctx, tenant, id)
	if err != nil {
		return r, err
	}
	before, _ := json.Marshal(r)
	var entries []audit.Entry
	var step Step
	if r.Prefetch != nil && !r.State.over() {
		if err := s.prefetch(ctx, &r, false); err != nil {
			return r, err
		}
	}
	if r.State == Running || r.State == Paused {
		// A paused rollout starts no box, but still watches those told.
		paused := r.State == Paused
		w, err := s.world(ctx, &r)
		if err != nil {
			return r, err
		}
		now := s.now()
		if s.firstLook(r.ID) && !r.Machine.Watched.IsZero() {
			r.Machine.GiveBack(now.Sub(r.Machine.Watched)) // this console was not running
		}
		if paused {
			step = r.Machine.Observe(now, w.look)
		} else {
			step = r.Machine.Tick(now, w.look)
		}
		if now.Sub(r.Machine.Watched) >= watchedEvery {
			r.Machine.Watched = now
		}
		me := actor(r)
		if step.RegionDone != "" {
			entries = append(entries, me.Did("rollout.group", r.ID, fmt.Sprintf("%s is through: %d kept on %s", groupName(r, step.RegionDone), len(step.KeepOnA), r.From)))
		}
		for _, id := range step.Revert {
			entries = append(entries, me.Did("rollout.revert", r.ID, fmt.Sprintf("box %s goes back to %s: %s", id, r.From, w.failureOf(r, id))))
		}
		switch {
		case r.Machine.Stopped != "":
			r.State, r.Reason = Stopped, r.Machine.Stopped
			entries = append(entries, me.Did("rollout.stop", r.ID, r.Reason))
		case r.Machine.Over():
			r.State, r.Reason = Finished, ""
			entries = append(entries, me.Did("rollout.done", r.ID, fmt.Sprintf("%s@%s to %s", r.App, r.From, r.To)))
		case paused:
		default:
			if r.State, r.Reason = r.waiting(); r.State == AwaitingApproval {
				entries = append(entries, me.Did("rollout.wait", r.ID, r.Reason))
			}
		}
	}
	if r.State.over() && r.Prefetch != nil && r.Prefetch.Placed {
		// Over: counted a last time; the boxes keep To's image only if
		// they run it.
		if err := s.prefetch(ctx, &r, true); err != nil {
			return r, err
		}
		if err := s.unprefetch(ctx, r); err != nil {
			return r, err
		}
		r.Prefetch.Placed = false
	}
	if after, _ := json.Marshal(r); !bytes.Equal(before, after) {
		r.UpdatedAt = s.now().UTC()
		if err := s.put(ctx, r, rev, true, entries...); err != nil {
			return r, err // changed meanwhile: the next tick decides again
		}
		if len(step.Update)+len(step.Revert) > 0 || step.RegionDone != "" || len(entries) > 0 {
			s.log.Info("rollout step", "rollout", r.ID, "update", len(step.Update), "revert", len(step.Revert),
				"group_done", step.RegionDone, "state", r.State, "reason", r.Reason)
		}
	}
	resync := !s.wasSynced(r.ID)
	if err := s.ensurePins(ctx, r, resync); err != nil {
		return r, err
	}
	if resync {
		s.setSynced(r.ID)
	}
	if r.State.over() {
		// Nothing more to do for it: off the controller's list. Nothing
		// changes a rollout that is over, so no guard is needed.
		if _, err := store.Delete(ctx, s.s, activeKey(r.TenantID, r.ID)); err != nil {
			return r, err
		}
		s.forget(r.ID)
		return r, nil
	}
	return r, nil
}

// prefetchName is the name of a rollout's ImagePrefetch objects.
func prefetchName(r Rollout) string { return "rollout-" + r.ID }

// prefetch asks every box of r whose agent can pre-pull to fetch To's
// image, once, and counts what the boxes say of it until all said.
func (s *Service) prefetch(ctx context.Context, r *Rollout, last bool) error {
	p := r.Prefetch
	if !p.Placed {
		all, err := s.boxes.Boxes(ctx, r.TenantID)
		if err != nil {
			return err
		}
		can := map[string]bool{}
		for _, b := range all {
			can[b.ID] = b.Capability >= desired.MinCapability(edgeboxv1.KindImagePrefetch)
		}
		obj := &edgeboxv1.DesiredObject{Kind: edgeboxv1.KindImagePrefetch, Name: prefetchName(*r),
			Spec: &edgeboxv1.DesiredObject_ImagePrefetch{ImagePrefetch: &edgeboxv1.ImagePrefetch{Runtime: p.Runtime, Image: p.Image}}}
		p.Asked = 0
		for _, g := range r.Machine.Regions {
			for _, b := range g.Boxes {
				if !can[b.ID] {
					continue
				}
				if _, err := s.desired.Put(ctx, b.ID, proto.Clone(obj).(*edgeboxv1.DesiredObject)); err != nil {
					return fmt.Errorf("pre-pull on box %s: %w", b.ID, err)
				}
				b.PrePull = true
				p.Asked++
			}
		}
		p.Placed = true
		return nil
	}
	if p.OnDisk+p.Failed >= p.Asked || (!last && !s.countDue(r.ID)) {
		return nil
	}
	p.OnDisk, p.Failed = 0, 0
	for _, g := range r.Machine.Regions {
		for _, b := range g.Boxes {
			st, err := s.status(ctx, b.ID, edgeboxv1.KindImagePrefetch, prefetchName(*r))
			if err != nil {
				return err
			}
			switch st.GetPhase() {
			case edgeboxv1.PhaseRunning:
				p.OnDisk++
			case edgeboxv1.PhaseFailed:
				p.Failed++
			}
		}
	}
	return nil
}

// watchedEvery is how often a running rollout notes that it is watched:
// at most one write of an idle rollout per period.
const watchedEvery = 10 * time.Second

// look is what this console did of a rollout since it started.
type look struct {
	ticked bool // it looked at the rollout
	synced bool // it brought the rollout's told boxes in line with their pins (ensurePins)
}

// firstLook reports whether this console looks at rollout id for the
// first time since it started.
func (s *Service) firstLook(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.looks[id]
	if l.ticked {
		return false
	}
	l.ticked = true
	s.looks[id] = l
	return true
}

// wasSynced reports whether this console brought the told boxes of
// rollout id in line with their pins since it started.
func (s *Service) wasSynced(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.looks[id].synced
}

func (s *Service) setSynced(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.looks[id]
	l.synced = true
	s.looks[id] = l
}

// forget drops what this console kept of rollout id, which is over.
func (s *Service) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.looks, id)
	delete(s.counted, id)
}

// countDue says whether the pre-pull of rollout id is to be counted now:
// every 10 s, as counting reads every box's status.
func (s *Service) countDue(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if last, ok := s.counted[id]; ok && now.Sub(last) < 10*time.Second {
		return false
	}
	s.counted[id] = now
	return true
}

// unprefetch takes r's ImagePrefetch objects back from its boxes.
func (s *Service) unprefetch(ctx context.Context, r Rollout) error {
	for _, g := range r.Machine.Regions {
		for _, b := range g.Boxes {
			if _, err := s.desired.Delete(ctx, b.ID, edgeboxv1.KindImagePrefetch, prefetchName(r)); err != nil {
				return fmt.Errorf("ending the pre-pull on box %s: %w", b.ID, err)
			}
		}
	}
	return nil
}

// status returns box's status of one object, or nil.
func (s *Service) status(ctx context.Context, box, kind, name string) (*edgeboxv1.ObjectStatus, error) {
	sts, err := s.desired.Statuses(ctx, box)
	if err != nil {
		return nil, err
	}
	for _, x := range sts {
		if x.GetKind() == kind && x.GetName() == name {
			return x, nil
		}
	}
	return nil, nil
}

func groupName(r Rollout, g string) string {
	switch {
	case len(r.Scope.Regions) > 0:
		return "region " + g
	case r.Scope.Site != "":
		return "site " + g
	}
	return "the rollout's boxes"
}

// finalScope is the pin scope a rollout's groups get once through, or
// "" when its boxes keep their own pins.
func finalScope(r Rollout) string {
	switch {
	case len(r.Scope.Regions) > 0:
		return apps.ScopeRegion
	case r.Scope.Site != "":
		return apps.ScopeSite
	}
	return ""
}

// ensurePins makes the app's pins say what r says: a box told to move
// is pinned to To, a box sent back is pinned to From, and a group that
// is through is pinned to To as a whole, its moved boxes' own pins then
// dropped. Pins already right are not written again.
//
// With resync (a console's first look at r), the boxes updating or sent
// back whose pins are right already are synced with them too: a pin is
// written before its box's desired state, and the console that wrote it
// may have died in between (a leader killed), leaving a box that would
// wait for the periodic app sync. A box whose desired state follows its
// pin is not written again.
func (s *Service) ensurePins(ctx context.Context, r Rollout, resync bool) error {
	tg, err := s.target(r.App)
	if err != nil {
		return err
	}
	have, err := tg.Pins(ctx, r.TenantID, r.App)
	if err != nil {
		return err
	}
	me := actor(r)
	var errs []error
	pin := func(scope, target, version string) bool {
		if have[scope+"/"+target] == version {
			return true
		}
		if err := tg.Pin(ctx, me, r.App, version, scope, target); err != nil {
			errs = append(errs, fmt.Errorf("pin %s %s to %s: %w", scope, target, version, err))
			return false
		}
		return true
	}
	// follow syncs box id with its pin to version when resync and the
	// pin was there before this tick.
	follow := func(id, version string) {
		if !resync || have[apps.ScopeBox+"/"+id] != version {
			return
		}
		b, err := s.boxes.Box(ctx, r.TenantID, id)
		if errdefs.Kind(err) == errdefs.ErrNotFound {
			return // a box gone has nothing to follow
		}
		if err == nil {
			err = tg.Sync(ctx, b)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sync box %s with its pin to %s: %w", id, version, err))
		}
	}
	final := finalScope(r)
	m := r.Machine
	var fleetBoxes []fleet.Box // read once, when a group is through
	for i, g := range m.Regions {
		through := i < m.Region && final != ""
		pinned := false
		if through {
			if have[final+"/"+g.Name] != r.To && fleetBoxes == nil {
				if fleetBoxes, err = s.boxes.Boxes(ctx, r.TenantID); err != nil {
					return err
				}
			}
			pinned = have[final+"/"+g.Name] == r.To || (groupPinnable(final, g, have, fleetBoxes) && pin(final, g.Name, r.To))
		}
		for _, b := range g.Boxes {
			switch {
			case b.Reverted:
				follow(b.ID, r.From)
				pin(apps.ScopeBox, b.ID, r.From)
			case pinned:
				// The group's pin holds the box now. Its own pin goes,
				// unless someone else changed it meanwhile.
				if have[apps.ScopeBox+"/"+b.ID] != r.To {
					continue
				}
				if err := tg.Unpin(ctx, me, r.App, apps.ScopeBox, b.ID); err != nil && errdefs.Kind(err) != errdefs.ErrNotFound {
					errs = append(errs, err)
				}
			case b.Phase == Updating || b.Phase == Gating || b.Phase == Done || (through && b.Phase != Waiting):
				if b.Phase == Updating {
					follow(b.ID, r.To)
				}
				pin(apps.ScopeBox, b.ID, r.To)
			}
		}
	}
	return errors.Join(errs...)
}

// groupPinnable reports whether group g, through, may be pinned to To as
// a whole: every approved box its region or site covers took part, and no
// site pin of the app lies under a region. Otherwise the pin would move
// boxes the rollout did not (install the app where it never ran, or send
// a site's boxes back to the site's pin once their own pins go): its
// boxes keep their own pins instead.
func groupPinnable(scope string, g *Region, have map[string]string, all []fleet.Box) bool {
	in := map[string]bool{}
	for _, b := range g.Boxes {
		in[b.ID] = true
	}
	for _, b := range all {
		covered := (scope == apps.ScopeRegion && b.Region == g.Name) || (scope == apps.ScopeSite && b.Site == g.Name)
		if !covered || b.State != fleet.StateApproved {
			continue
		}
		if !in[b.ID] {
			return false
		}
		if _, ok := have[apps.ScopeSite+"/"+b.Site]; ok && scope == apps.ScopeRegion {
			return false
		}
	}
	return true
}

// world is what a tick knows of the boxes of one rollout: read on
// demand, once a box a tick.
type world struct {
	s      *Service
	ctx    context.Context
	r      *Rollout
	rules  Rules
	probes bool // To has probes: a box is healthy only once they pass
	// kind and name are the object whose status a box reports of the
	// rollout's app.
	kind, name string
	// prepull: the boxes asked to pre-pull To.
	prepull map[string]bool
	now     time.Time
	windows map[string]compiledPolicy
	seen    map[string]lookResult
}

type compiledPolicy struct {
	c   compiled
	err error
}

type lookResult struct {
	s     Seen
	heard bool
}

func (s *Service) world(ctx context.Context, r *Rollout) (*world, error) {
	rules, err := s.GetRules(ctx, r.TenantID)
	if err != nil {
		return nil, err
	}
	tg, err := s.target(r.App)
	if err != nil {
		return nil, err
	}
	probes, err := tg.Probes(ctx, r.TenantID, r.App, r.To)
	if err != nil {
		return nil, err
	}
	kind, name := tg.Status(r.App)
	prepull := map[string]bool{}
	for _, g := range r.Machine.Regions {
		for _, b := range g.Boxes {
			prepull[b.ID] = b.PrePull
		}
	}
	return &world{s: s, ctx: ctx, r: r, rules: rules, probes: probes, kind: kind, name: name, now: s.now(), prepull: prepull,
		windows: map[string]compiledPolicy{}, seen: map[string]lookResult{}}, nil
}

// failureOf is what a box that goes back failed of, for the audit.
func (w *world) failureOf(r Rollout, id string) string {
	for _, g := range r.Machine.Regions {
		for _, b := range g.Boxes {
			if b.ID == id {
				if b.Reason != "" {
					return b.Reason
				}
				return string(b.Phase)
			}
		}
	}
	return "unknown"
}

func (w *world) look(id string) (Seen, bool) {
	if l, ok := w.seen[id]; ok {
		return l.s, l.heard
	}
	s, heard := w.read(id)
	w.seen[id] = lookResult{s, heard}
	return s, heard
}

// read is what box id reports of the rollout's app, and what holds it.
func (w *world) read(id string) (Seen, bool) {
	var seen Seen
	ctx, r := w.ctx, w.r
	b, err := w.s.boxes.Box(ctx, r.TenantID, id)
	if err != nil {
		seen.Hold = "the console cannot read the box: " + err.Error()
		return seen, false
	}
	if b.State != fleet.StateApproved {
		seen.Hold = "the box is " + string(b.State)
		return seen, false
	}
	var st, pre, lock *edgeboxv1.ObjectStatus
	sts, err := w.s.desired.Statuses(ctx, id)
	if err != nil {
		seen.Hold = "the console cannot read the box's status: " + err.Error()
		return seen, false
	}
	for _, x := range sts {
		switch {
		case x.GetKind() == w.kind && x.GetName() == w.name:
			st = x
		case x.GetKind() == edgeboxv1.KindImagePrefetch && x.GetName() == prefetchName(*r):
			pre = x
		case x.GetKind() == edgeboxv1.KindUpdateLock && lock == nil:
			lock = x
		}
	}
	prepulls := r.Prefetch != nil && r.Prefetch.Placed && w.prepull[id]
	if st != nil {
		seen.Runs = st.GetRelease()
		seen.Healthy = st.GetPhase() == edgeboxv1.PhaseRunning &&
			(st.GetHealth() == edgeboxv1.Healthy || (st.GetHealth() == "" && !w.probes))
		if w.aboutTo(id, st) {
			switch {
			case st.GetPhase() == edgeboxv1.PhaseFailed:
				seen.Failure = failure(st.GetReason()) + ": " + clip(st.GetMessage(), 200)
			case st.GetRelease() == r.To && st.GetRestarts() > 0:
				// Restarted since it started To: its probes failed, or
				// it exited. A release must run steadily to pass.
				seen.Failure = fmt.Sprintf("%s: restarted %d times", failure(st.GetReason()), st.GetRestarts())
				if m := st.GetMessage(); m != "" {
					seen.Failure += "; " + clip(m, 200)
				}
			}
		}
		if st.GetRelease() == r.To && st.GetHealth() == edgeboxv1.Unhealthy {
			seen.Failure = "probe: " + clip(st.GetMessage(), 200)
		}
	}
	switch ok, why := w.open(b); {
	case w.s.online != nil && !w.s.online(id):
		seen.Hold = "the box is offline"
		if w.s.lineDown != nil && w.s.lineDown(id) {
			seen.Hold, seen.Locked = "the box's line is down; its site hears it running", true
		}
	case lock != nil:
		seen.Hold, seen.Locked = "update lock held by "+lock.GetName(), true
		if m := lock.GetMessage(); m != "" {
			seen.Hold += ": " + clip(m, 200)
		}
	case !ok:
		seen.Hold = why
	case prepulls && pre.GetPhase() == edgeboxv1.PhaseFailed:
		// The box tries again; one that keeps failing fails its wave.
		seen.Hold = "pre-pull of " + r.To + " failed, trying again: " + clip(pre.GetMessage(), 200)
		seen.HoldFails = "pull: " + clip(pre.GetMessage(), 200)
	case prepulls && pre.GetPhase() != edgeboxv1.PhaseRunning:
		seen.Hold = "pre-pulling " + r.To
		if m := pre.GetMessage(); m != "" {
			seen.Hold += ": " + clip(m, 200)
		}
	}
	return seen, st != nil
}

// aboutTo reports whether st is the box's word on the rollout's To: the
// box acted on the desired object that names it.
func (w *world) aboutTo(id string, st *edgeboxv1.ObjectStatus) bool {
	objs, _, err := w.s.desired.Live(w.ctx, id)
	if err != nil {
		return false
	}
	for _, o := range objs {
		if edgeboxv1.KindOf(o) == w.kind && o.GetName() == w.name {
			return versionOf(o) == w.r.To && st.GetObservedRevision() >= o.GetRevision()
		}
	}
	return false
}

// open says whether box b's maintenance policy lets it update now.
func (w *world) open(b fleet.Box) (bool, string) {
	key := "site/" + b.Site
	if _, ok := w.rules.Sites[b.Site]; !ok {
		key = "region/" + b.Region
	}
	cp, ok := w.windows[key]
	if !ok {
		p, has := w.rules.policyFor(b)
		if !has {
			return true, ""
		}
		cp.c, cp.err = p.compile()
		w.windows[key] = cp
	}
	if cp.err != nil {
		return false, "its maintenance policy's " + cp.err.Error()
	}
	ok, why := cp.c.open(w.now)
	if !ok {
		return false, "maintenance window: " + why
	}
	return true, ""
}

// failure names the step a box failed at from its status's reason.
func failure(reason string) string {
	switch reason {
	case edgeboxv1.ReasonPullFailed:
		return "pull"
	case edgeboxv1.ReasonUnhealthy:
		return "probe"
	case "Refused":
		return "probation" // the agent: it failed its probation, or did before
	case "SignatureInvalid":
		return "signature"
	}
	return "start"
}
