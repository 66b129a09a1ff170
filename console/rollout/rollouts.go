package rollout

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/console/agentrel"
	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// Scope is what a rollout moves: exactly one of its fields is set.
type Scope struct {
	// Regions are taken one after another, in this order; a national
	// push names them all. Each region is pinned to the new release
	// once its waves are through.
	Regions []string `json:"regions,omitempty"`
	// Site is one site, pinned to the new release at the end.
	Site string `json:"site,omitempty"`
	// Selector picks boxes by their labels; Boxes names them. Their
	// boxes keep a pin each at the end.
	Selector map[string]string `json:"selector,omitempty"`
	Boxes    []string          `json:"boxes,omitempty"`
}

// State is where a rollout stands.
type State string

// The states of a rollout.
const (
	AwaitingApproval State = "awaiting-approval"
	Running          State = "running"
	Paused           State = "paused"
	Stopped          State = "stopped" // by its failure policy
	Aborted          State = "aborted"
	Finished         State = "done"
)

// over reports whether a rollout in state s moves no more boxes.
func (s State) over() bool { return s == Stopped || s == Aborted || s == Finished }

// Rollout moves the boxes of a scope from one release of an app to
// another, as its Machine decides.
type Rollout struct {
	ID       string `json:"id"`
	TenantID string `json:"tenant_id"`
	App      string `json:"app"`
	From     string `json:"from"`
	To       string `json:"to"`
	Scope    Scope  `json:"scope"`
	State    State  `json:"state"`
	// Reason says why the rollout is paused, stopped or aborted, or what
	// approval it waits for.
	Reason    string     `json:"reason,omitempty"`
	Approvals []Approval `json:"approvals,omitempty"`
	// ApproveStart: the tenant's rules asked for an approval to start
	// when the rollout was made (those after the first wave are the
	// Machine's).
	ApproveStart bool `json:"approve_start,omitempty"`
	// Skipped are the boxes of the scope that did not run From when the
	// rollout was made, and why.
	Skipped   []Skipped `json:"skipped,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	UpdatedAt time.Time `json:"updated_at"`
	// Prefetch is the pre-pull of To's image, for releases that have one
	// to pull (containers and VMs).
	Prefetch *Prefetch `json:"prefetch,omitempty"`
	Machine  *Machine  `json:"machine"`
}

// Prefetch is a rollout's pre-pull: every box of it that can is asked to
// have To's image on disk, while it still runs From, before its wave.
type Prefetch struct {
	Runtime string `json:"runtime"`
	Image   string `json:"image"`
	// Placed: the boxes were asked (ImagePrefetch objects written);
	// cleared again when the rollout is over and they were taken back.
	Placed bool `json:"placed,omitempty"`
	// Asked counts the boxes asked (those whose agents can pre-pull);
	// OnDisk and Failed count what they said last.
	Asked  int `json:"asked"`
	OnDisk int `json:"on_disk"`
	Failed int `json:"failed"`
}

// Approval is one user's approval of a rollout.
type Approval struct {
	By    string    `json:"by"`
	At    time.Time `json:"at"`
	Stage string    `json:"stage"` // "start" or "first-wave"
}

// Skipped is a box of a rollout's scope that it leaves alone.
type Skipped struct {
	Box    string `json:"box"`
	Reason string `json:"reason"`
}

// Request is what an operator asks a rollout for.
type Request struct {
	App      string
	From, To string
	Scope    Scope
	Settings Settings
}

// Limits on a request.
const (
	maxRegions   = 200
	maxBoxes     = 20000
	maxGate      = 7 * 24 * time.Hour
	maxTimeout   = 7 * 24 * time.Hour
	minTimeout   = 10 * time.Second
	maxSkipped   = 1000
	idBytes      = 6
	finalPinNone = ""
)

// Service keeps rollouts in the store, and its controller (Run) moves
// them along.
type Service struct {
	s        store.Store
	apps     *apps.Apps
	agent    *agentrel.Service
	boxes    Boxes
	desired  *desired.State
	online   func(box string) bool
	lineDown func(box string) bool
	now      func() time.Time
	every    time.Duration
	log      *slog.Logger

	mu      sync.Mutex           // guards counted, looks and progress
	counted map[string]time.Time // rollout -> when its pre-pull was last counted
	looks   map[string]look      // what this console did of each rollout since it started
	// progress is where each active rollout stood at the controller's
	// last look (TickAll), for the metrics.
	progress []progress
}

// Boxes is what rollouts need of the fleet.
type Boxes interface {
	Boxes(ctx context.Context, tenant string) ([]fleet.Box, error)
	Box(ctx context.Context, tenant, id string) (fleet.Box, error)
}

// Config is what a Service is built from.
type Config struct {
	Store store.Store
	Apps  *apps.Apps
	// Agent, when set, lets rollouts move boxes between agent versions
	// (app agentrel.App).
	Agent   *agentrel.Service
	Boxes   Boxes
	Desired *desired.State
	// Online reports whether a box has a live session now.
	Online func(box string) bool
	// LineDown reports whether a box without a session runs, as its
	// site's peers say (site health): it is held, neither failed for its
	// silence nor told to update. Nil: never.
	LineDown func(box string) bool
	// Every is how often the controller looks at running rollouts
	// (2 s when zero).
	Every time.Duration
	Now   func() time.Time // time.Now when nil
	Log   *slog.Logger
}

// New returns the rollout service over cfg. It starts nothing.
func New(cfg Config) *Service {
	s := &Service{s: cfg.Store, apps: cfg.Apps, agent: cfg.Agent, boxes: cfg.Boxes, desired: cfg.Desired, online: cfg.Online, lineDown: cfg.LineDown,
		now: cfg.Now, every: cfg.Every, log: cfg.Log.With("component", "rollout"), counted: map[string]time.Time{}, looks: map[string]look{}}
	if s.now == nil {
		s.now = time.Now
	}
	if s.every <= 0 {
		s.every = 2 * time.Second
	}
	return s
}

func rolloutKey(tenant, id string) string { return "rollouts/" + tenant + "/" + id }

// guardKey is written by every rollout made of tenant's app, so two made
// at once cannot both pass the check that they share no box.
func guardKey(tenant, app string) string { return "rollout-guard/" + tenant + "/" + app }

// activeKey marks a rollout the controller still has work for.
func activeKey(tenant, id string) string { return "rollouts-active/" + tenant + "/" + id }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// validate checks a request's fields that need no store.
func (q Request) validate() error {
	set := 0
	for _, ok := range []bool{len(q.Scope.Regions) > 0, q.Scope.Site != "", len(q.Scope.Selector) > 0, len(q.Scope.Boxes) > 0} {
		if ok {
			set++
		}
	}
	if set != 1 {
		return errdefs.Invalid("name what the rollout moves: regions (in order), a site, a label selector or boxes; exactly one of them")
	}
	if q.From == "" || q.To == "" {
		return errdefs.Invalid("name the release the boxes run now (from) and the one they move to (to)")
	}
	if q.From == q.To {
		return errdefs.Invalid("from and to are both %s: nothing to move", q.From)
	}
	if len(q.Scope.Regions) > maxRegions || len(q.Scope.Boxes) > maxBoxes {
		return errdefs.Invalid("a rollout names at most %d regions or %d boxes", maxRegions, maxBoxes)
	}
	seen := map[string]bool{}
	for _, r := range q.Scope.Regions {
		if err := fleet.ValidatePlace("region", r); err != nil || r == "" {
			return errdefs.Invalid("region %q: not a valid region name", trunc(r))
		}
		if seen[r] {
			return errdefs.Invalid("region %s is named twice", r)
		}
		seen[r] = true
	}
	if q.Scope.Site != "" {
		if err := fleet.ValidatePlace("site", q.Scope.Site); err != nil {
			return errdefs.Invalid("site %q: not a valid site name", trunc(q.Scope.Site))
		}
	}
	if len(q.Scope.Selector) > 0 {
		if err := fleet.ValidateLabels(q.Scope.Selector); err != nil {
			return errdefs.Invalid("selector: %v", err)
		}
	}
	st := q.Settings
	if len(st.Waves) > maxWaves {
		return errdefs.Invalid("at most %d waves", maxWaves)
	}
	for _, w := range st.Waves {
		if w.Boxes < 0 || w.Percent < 0 || w.Percent > 100 || (w.Boxes == 0 && w.Percent == 0) {
			return errdefs.Invalid("a wave takes a number of boxes from 1, or a share above 0 %% and at most 100 %%")
		}
	}
	if st.Gate < 0 || st.Gate > maxGate {
		return errdefs.Invalid("gate %s: from 0 to %s", st.Gate, maxGate)
	}
	if st.BoxTimeout != 0 && (st.BoxTimeout < minTimeout || st.BoxTimeout > maxTimeout) {
		return errdefs.Invalid("box timeout %s: from %s to %s", st.BoxTimeout, minTimeout, maxTimeout)
	}
	if st.MaxUnavailable < 0 || st.MaxUnavailable > maxBoxes {
		return errdefs.Invalid("max unavailable %d: from 1 to %d", st.MaxUnavailable, maxBoxes)
	}
	if st.FailurePercent < 0 || st.FailurePercent > 100 {
		return errdefs.Invalid("failure threshold %g %%: from 0 to 100", st.FailurePercent)
	}
	return nil
}

// Create plans and stores a rollout of the caller's tenant. Only boxes
// of the scope that run From now take part; the others are listed as
// skipped. A rollout that shares a box with another rollout of the same
// app that is not over is refused.
func (s *Service) Create(ctx context.Context, who audit.Actor, q Request) (Rollout, error) {
	if err := q.validate(); err != nil {
		return Rollout{}, err
	}
	tenant := who.TenantID
	tg, err := s.target(q.App)
	if err != nil {
		return Rollout{}, err
	}
	prefetch, err := tg.Check(ctx, tenant, q.App, q.From, q.To)
	if err != nil {
		return Rollout{}, err
	}
	all, err := s.boxes.Boxes(ctx, tenant)
	if err != nil {
		return Rollout{}, err
	}
	runs, err := tg.Versions(ctx, tenant, q.App, all)
	if err != nil {
		return Rollout{}, err
	}
	groups, skipped, err := plan(q, all, runs)
	if err != nil {
		return Rollout{}, err
	}
	rules, err := s.GetRules(ctx, tenant)
	if err != nil {
		return Rollout{}, err
	}
	// Two creates at once must not both pass the overlap check: each
	// writes the app's guard key, and only one finds it as it was.
	var guardRev int64
	if kv, err := s.s.Get(ctx, guardKey(tenant, q.App)); err == nil {
		guardRev = kv.ModRevision
	} else if !errors.Is(err, store.ErrNotFound) {
		return Rollout{}, err
	}
	if err := s.checkOverlap(ctx, tenant, q.App, groups); err != nil {
		return Rollout{}, err
	}
	now := s.now().UTC()
	var id [idBytes]byte
	rand.Read(id[:])
	r := Rollout{ID: "r-" + hex.EncodeToString(id[:]), TenantID: tenant, App: q.App, From: q.From, To: q.To, Scope: q.Scope,
		State: Running, CreatedAt: now, CreatedBy: who.Name, UpdatedAt: now, Skipped: skipped}
	if len(r.Skipped) > maxSkipped {
		r.Skipped = r.Skipped[:maxSkipped]
	}
	r.Prefetch = prefetch
	r.Machine = NewMachine(q.From, q.To, q.Settings, groups)
	r.Machine.ApproveFirstWave = rules.ApproveFirstWave
	r.ApproveStart = rules.ApproveStart
	r.State, r.Reason = r.waiting()
	n := 0
	for _, g := range groups {
		n += len(g.Boxes)
	}
	detail := fmt.Sprintf("%s@%s to %s on %s: %s in %s", q.App, q.From, q.To, r.Scope.String(), plural(n, "box"), plural(len(groups), "group"))
	raw, err := json.Marshal(r)
	if err != nil {
		return Rollout{}, err
	}
	res, err := s.s.Txn(ctx, store.Txn{
		If: []store.Cmp{{Key: rolloutKey(tenant, r.ID), ModRevision: 0}, {Key: guardKey(tenant, q.App), ModRevision: guardRev}},
		Then: []store.Op{{Key: rolloutKey(tenant, r.ID), Value: raw}, {Key: activeKey(tenant, r.ID), Value: []byte{}},
			{Key: guardKey(tenant, q.App), Value: []byte(r.ID)}, audit.Op(s.now(), who.Did("rollout.create", r.ID, detail))}})
	if err != nil {
		return Rollout{}, err
	}
	if !res.Succeeded {
		return Rollout{}, errdefs.Conflict("another rollout of %s was made meanwhile; look at 'edgebox rollout ls' and try again", q.App)
	}
	s.log.Info("rollout created", "rollout", r.ID, "tenant", tenant, "detail", detail, "state", r.State)
	return r, nil
}

// String names a scope for people.
func (sc Scope) String() string {
	switch {
	case len(sc.Regions) > 0:
		return "regions " + strings.Join(sc.Regions, ", ")
	case sc.Site != "":
		return "site " + sc.Site
	case len(sc.Selector) > 0:
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(sc.Selector)) {
			kv = append(kv, k+"="+sc.Selector[k])
		}
		return "boxes labelled " + strings.Join(kv, ",")
	}
	return plural(len(sc.Boxes), "box")
}

// plan groups the boxes of q's scope that run From into the machine's
// regions, and lists the others of the scope as skipped. A region group
// is named for its region, a site's for its site; a selector's or a box
// list's one group has no name, as nothing wider is pinned at its end.
func plan(q Request, all []fleet.Box, runs map[string]string) ([]Region, []Skipped, error) {
	byID := map[string]fleet.Box{}
	for _, b := range all {
		byID[b.ID] = b
	}
	var skipped []Skipped
	take := func(b fleet.Box) bool {
		switch {
		case b.State != fleet.StateApproved:
			skipped = append(skipped, Skipped{b.ID, "not approved"})
		case runs[b.ID] == "":
			skipped = append(skipped, Skipped{b.ID, "does not run " + q.App})
		case runs[b.ID] != q.From:
			skipped = append(skipped, Skipped{b.ID, "runs " + runs[b.ID]})
		default:
			return true
		}
		return false
	}
	var groups []Region
	switch {
	case len(q.Scope.Regions) > 0:
		for _, name := range q.Scope.Regions {
			g, any := Region{Name: name}, false
			for _, b := range all {
				if b.Region != name {
					continue
				}
				any = true
				if take(b) {
					g.Boxes = append(g.Boxes, &Box{ID: b.ID, Site: b.Site})
				}
			}
			if !any {
				return nil, nil, errdefs.Invalid("region %s has no boxes", name)
			}
			if len(g.Boxes) > 0 {
				groups = append(groups, g)
			}
		}
	case q.Scope.Site != "":
		g, any := Region{Name: q.Scope.Site}, false
		for _, b := range all {
			if b.Site == q.Scope.Site {
				any = true
				if take(b) {
					g.Boxes = append(g.Boxes, &Box{ID: b.ID, Site: b.Site})
				}
			}
		}
		if !any {
			return nil, nil, errdefs.Invalid("site %s has no boxes", q.Scope.Site)
		}
		groups = append(groups, g)
	default:
		var g Region
		ids := q.Scope.Boxes
		if len(q.Scope.Selector) > 0 {
			ids = nil
			for _, b := range all {
				if matches(b.Labels, q.Scope.Selector) {
					ids = append(ids, b.ID)
				}
			}
		}
		seen := map[string]bool{}
		for _, id := range ids {
			b, ok := byID[id]
			if !ok {
				return nil, nil, errdefs.NotFound("no box %q", trunc(id))
			}
			if seen[id] {
				continue
			}
			seen[id] = true
			if take(b) {
				g.Boxes = append(g.Boxes, &Box{ID: b.ID, Site: b.Site})
			}
		}
		groups = append(groups, g)
	}
	total := 0
	for i := range groups {
		groups[i].Boxes = spread(groups[i].Boxes)
		total += len(groups[i].Boxes)
	}
	if total == 0 {
		return nil, nil, errdefs.Invalid("no box of %s runs %s@%s: nothing to move", q.Scope.String(), q.App, q.From)
	}
	groups = slices.DeleteFunc(groups, func(g Region) bool { return len(g.Boxes) == 0 })
	return groups, skipped, nil
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// spread orders boxes so that consecutive ones are of different sites
// where it can (each site's boxes by ID, the sites taken in turn): an
// early wave then samples several sites, and a site's limit on boxes
// updating at once holds back as few as it can.
func spread(boxes []*Box) []*Box {
	bySite := map[string][]*Box{}
	for _, b := range boxes {
		bySite[b.Site] = append(bySite[b.Site], b)
	}
	sites := slices.Sorted(maps.Keys(bySite))
	for _, s := range sites {
		slices.SortFunc(bySite[s], func(a, b *Box) int { return cmp.Compare(a.ID, b.ID) })
	}
	out := make([]*Box, 0, len(boxes))
	for i := 0; len(out) < len(boxes); i++ {
		for _, s := range sites {
			if i < len(bySite[s]) {
				out = append(out, bySite[s][i])
			}
		}
	}
	return out
}

// checkOverlap refuses a plan that shares a box with a rollout of the
// same app that is not over.
func (s *Service) checkOverlap(ctx context.Context, tenant, app string, groups []Region) error {
	active, err := s.active(ctx, tenant)
	if err != nil {
		return err
	}
	mine := map[string]bool{}
	for _, g := range groups {
		for _, b := range g.Boxes {
			mine[b.ID] = true
		}
	}
	for _, r := range active {
		if r.App != app || r.State.over() {
			continue
		}
		for _, g := range r.Machine.Regions {
			for _, b := range g.Boxes {
				if mine[b.ID] {
					return errdefs.Conflict("rollout %s (%s@%s to %s, %s) already moves box %s; wait for it to end, or abort it",
						r.ID, r.App, r.From, r.To, r.State, b.ID)
				}
			}
		}
	}
	return nil
}

// active returns tenant's rollouts the controller still has work for,
// or every tenant's when tenant is "".
func (s *Service) active(ctx context.Context, tenant string) ([]Rollout, error) {
	prefix := "rollouts-active/"
	if tenant != "" {
		prefix += tenant + "/"
	}
	kvs, _, err := s.s.Range(ctx, prefix, 0)
	if err != nil {
		return nil, err
	}
	var out []Rollout
	for _, kv := range kvs {
		t, id, _ := strings.Cut(strings.TrimPrefix(kv.Key, "rollouts-active/"), "/")
		r, _, err := s.get(ctx, t, id)
		if errdefs.Kind(err) == errdefs.ErrNotFound {
			continue
		} else if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// put stores r: created when modRev is 0 (the ID must be new), else only
// if it is still at modRev. active keeps r on the controller's list, or
// takes it off. The entries are audited in the same transaction.
func (s *Service) put(ctx context.Context, r Rollout, modRev int64, active bool, entries ...audit.Entry) error {
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	t := store.Txn{If: []store.Cmp{{Key: rolloutKey(r.TenantID, r.ID), ModRevision: modRev}},
		Then: []store.Op{{Key: rolloutKey(r.TenantID, r.ID), Value: raw}}}
	if active {
		t.Then = append(t.Then, store.Op{Key: activeKey(r.TenantID, r.ID), Value: []byte{}})
	} else {
		t.Then = append(t.Then, store.Op{Key: activeKey(r.TenantID, r.ID), Delete: true})
	}
	for _, e := range entries {
		t.Then = append(t.Then, audit.Op(s.now(), e))
	}
	res, err := s.s.Txn(ctx, t)
	if err != nil {
		return err
	}
	if !res.Succeeded {
		return errdefs.Conflict("rollout %s changed meanwhile; try again", r.ID)
	}
	return nil
}

func (s *Service) get(ctx context.Context, tenant, id string) (Rollout, int64, error) {
	var r Rollout
	if !idRE(id) {
		return r, 0, errdefs.NotFound("no rollout %q", trunc(id))
	}
	kv, err := s.s.Get(ctx, rolloutKey(tenant, id))
	if errors.Is(err, store.ErrNotFound) {
		return r, 0, errdefs.NotFound("no rollout %s", id)
	} else if err != nil {
		return r, 0, err
	}
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return r, 0, fmt.Errorf("rollout %s: %w", id, err)
	}
	return r, kv.ModRevision, nil
}

func idRE(id string) bool {
	if len(id) != 2+2*idBytes || !strings.HasPrefix(id, "r-") {
		return false
	}
	_, err := hex.DecodeString(id[2:])
	return err == nil
}

// Get returns one of tenant's rollouts.
func (s *Service) Get(ctx context.Context, tenant, id string) (Rollout, error) {
	r, _, err := s.get(ctx, tenant, id)
	return r, err
}

// List returns tenant's rollouts, newest first.
func (s *Service) List(ctx context.Context, tenant string) ([]Rollout, error) {
	kvs, _, err := s.s.Range(ctx, "rollouts/"+tenant+"/", 0)
	if err != nil {
		return nil, err
	}
	out := make([]Rollout, 0, len(kvs))
	for _, kv := range kvs {
		var r Rollout
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", kv.Key, err)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Rollout) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out, nil
}

// change applies an operator's change to a rollout, retrying when the
// controller wrote it meanwhile.
func (s *Service) change(ctx context.Context, who audit.Actor, id, action string, f func(r *Rollout) (string, error)) (Rollout, error) {
	for range 20 {
		r, rev, err := s.get(ctx, who.TenantID, id)
		if err != nil {
			return r, err
		}
		detail, err := f(&r)
		if err != nil {
			return r, err
		}
		r.UpdatedAt = s.now().UTC()
		err = s.put(ctx, r, rev, true, who.Did(action, r.ID, detail))
		if errdefs.Kind(err) == errdefs.ErrConflict {
			continue
		}
		if err == nil {
			s.log.Info("rollout changed", "rollout", r.ID, "action", action, "by", who.Name, "detail", detail)
		}
		return r, err
	}
	return Rollout{}, errdefs.Unavailable("rollout %s changes too often to change it now; try again", id)
}

// Pause stops a running rollout from starting boxes. Boxes already told
// go on, and are still watched: one that fails goes back at once, and a
// failure past the threshold still stops the rollout.
func (s *Service) Pause(ctx context.Context, who audit.Actor, id, why string) (Rollout, error) {
	return s.change(ctx, who, id, "rollout.pause", func(r *Rollout) (string, error) {
		if r.State != Running && r.State != AwaitingApproval {
			return "", errdefs.Conflict("rollout %s is %s, not running", r.ID, r.State)
		}
		r.State, r.Reason = Paused, "paused by "+who.Name
		if why != "" {
			r.Reason += ": " + trunc(why)
		}
		return r.Reason, nil
	})
}

// Resume takes a paused rollout on.
func (s *Service) Resume(ctx context.Context, who audit.Actor, id string) (Rollout, error) {
	return s.change(ctx, who, id, "rollout.resume", func(r *Rollout) (string, error) {
		if r.State != Paused {
			return "", errdefs.Conflict("rollout %s is %s, not paused", r.ID, r.State)
		}
		r.State, r.Reason = r.waiting()
		return "resumed", nil
	})
}

// Abort ends a rollout. With revert, every box it moved goes back to
// the release it ran before; without, boxes stay where they are.
func (s *Service) Abort(ctx context.Context, who audit.Actor, id string, revert bool) (Rollout, error) {
	return s.change(ctx, who, id, "rollout.abort", func(r *Rollout) (string, error) {
		if r.State.over() {
			return "", errdefs.Conflict("rollout %s is already %s", r.ID, r.State)
		}
		r.State, r.Reason = Aborted, "aborted by "+who.Name
		m := r.Machine
		m.Stopped = r.Reason
		if !revert {
			return "boxes stay where they are", nil
		}
		back := m.revert(func(b *Box) bool { return b.Phase != Waiting && b.Phase != Held })
		return fmt.Sprintf("%s go back to %s", plural(len(back), "box"), r.From), nil
	})
}

// Approve gives the approval a rollout waits for: a second pair of eyes,
// so the user who created the rollout cannot; any other user who may
// operate can, at either stage.
func (s *Service) Approve(ctx context.Context, who audit.Actor, id string) (Rollout, error) {
	return s.change(ctx, who, id, "rollout.approve", func(r *Rollout) (string, error) {
		stage := ""
		switch {
		case r.State == AwaitingApproval && r.needsStartApproval():
			stage = "start"
		case r.State == AwaitingApproval && r.Machine.AwaitsApproval():
			stage = "first-wave"
		default:
			return "", errdefs.Conflict("rollout %s is %s and waits for no approval", r.ID, r.State)
		}
		if who.Name == r.CreatedBy {
			return "", errdefs.Permission("%s created rollout %s: another user must approve it", who.Name, r.ID)
		}

		r.Approvals = append(r.Approvals, Approval{By: who.Name, At: s.now().UTC(), Stage: stage})
		if stage == "first-wave" {
			r.Machine.Approved = true
		}
		r.State, r.Reason = r.waiting()
		return "approved: " + stage, nil
	})
}

// needsStartApproval reports whether r needs an approval to start and
// has none yet.
func (r *Rollout) needsStartApproval() bool {
	if !r.ApproveStart {
		return false
	}
	for _, a := range r.Approvals {
		if a.Stage == "start" {
			return false
		}
	}
	return true
}

// waiting returns the state a rollout that may go on is in: awaiting an
// approval, or running.
func (r *Rollout) waiting() (State, string) {
	switch {
	case r.needsStartApproval():
		return AwaitingApproval, "a second user's approval to start"
	case r.Machine.AwaitsApproval():
		return AwaitingApproval, "a second user's approval to go on after the first wave"
	}
	return Running, ""
}
