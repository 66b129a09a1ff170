// Package apps keeps the console's apps, their immutable releases and the
// pins that say which release runs where, and turns them into each box's
// Workload objects. A pin names a region, a site or a box; a box's pin
// overrides its site's, which overrides its region's. A box that joins a
// pinned region or site gets the app with nothing more to do.
//
// Keys in the store, per tenant:
//
//	apps/<tenant>/<app>/app                    -> App (JSON)
//	apps/<tenant>/<app>/rel/<version>          -> Release (JSON)
//	apps/<tenant>/<app>/pin/<scope>/<target>   -> Pin (JSON)
//
// These types are the storage format, apart from the API's: httpapi
// converts between them (see spec.go).
//
// Each change an operator makes (an app, a release, a pin) writes its
// audit entry in the transaction that makes it. What follows from a pin
// (each box's Workload objects) is not audited again; the keys a deploy
// leases are, by the key registry, as the actor "deploy".
package apps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/images/registry"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// App is a robot or service operators deploy.
type App struct {
	TenantID    string    `json:"tenant_id"`
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	CreatedBy   string    `json:"created_by"`
}

// Release is one immutable version of an app: what a box runs. Its spec
// is what the operator gave, with Image resolved to a digest for
// containerd and qemu.
type Release struct {
	TenantID string `json:"tenant_id"`
	App      string `json:"app"`
	Spec
	// Tag is the tag Image was resolved from, for people reading.
	Tag       string    `json:"tag,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
}

// Scopes a pin can name.
const (
	ScopeRegion = "region"
	ScopeSite   = "site"
	ScopeBox    = "box"
)

// Pin says that app runs Version wherever Scope/Target covers.
type Pin struct {
	TenantID string    `json:"tenant_id"`
	App      string    `json:"app"`
	Scope    string    `json:"scope"`
	Target   string    `json:"target"`
	Version  string    `json:"version"`
	At       time.Time `json:"at"`
	By       string    `json:"by"`
}

// Boxes is what apps needs of the fleet.
type Boxes interface {
	Boxes(ctx context.Context, tenant string) ([]fleet.Box, error)
	Box(ctx context.Context, tenant, id string) (fleet.Box, error)
}

// Images resolves and checks image references in the console's registry.
type Images interface {
	Resolve(ctx context.Context, repo, tag string) (digest.Digest, error)
	HasManifest(ctx context.Context, repo string, d digest.Digest) (bool, error)
}

// Apps is the console's app catalogue and deployer.
type Apps struct {
	s store.Store
	// catalogues keeps each tenant's catalogue for the boxes' hellos,
	// until something under apps/ changes.
	catalogues *store.Memo[catalogue]
	desired    *desired.State
	boxes      Boxes
	images     Images
	// hosts are the names images give the console's registry; the first
	// is the one releases are written with.
	hosts []string
	log   *slog.Logger
	now   func() time.Time
	keys  Leaser // nil: releases' key needs are not leased
}

// Leaser gives workloads the UKEYs they need.
type Leaser interface {
	// EnsureLeases leases one key per need to workload on box (and
	// releases what it holds beyond), saying which needs no free key
	// meets.
	EnsureLeases(ctx context.Context, who audit.Actor, box, workload string, needs []map[string]string) error
}

// New returns the catalogue kept in s. Deploys lease the keys releases
// need with keys; with keys nil, releases' key needs are not leased.
func New(s store.Store, d *desired.State, boxes Boxes, images Images, registryHosts []string, keys Leaser, log *slog.Logger) *Apps {
	return &Apps{s: s, catalogues: store.NewMemo[catalogue](s, "apps/", maxCatalogues, log), desired: d, boxes: boxes,
		images: images, hosts: registryHosts, keys: keys, log: log, now: time.Now}
}

// maxCatalogues bounds the tenants whose catalogue is kept.
const maxCatalogues = 1000

// Run keeps the tenants' catalogues fresh for SyncBox until ctx ends.
func (a *Apps) Run(ctx context.Context) error { return a.catalogues.Run(ctx) }

// txn applies t; whatever came of it, the kept catalogues are dropped,
// so this console reads its own writes at once.
func (a *Apps) txn(ctx context.Context, t store.Txn) (store.TxnResult, error) {
	defer a.catalogues.Forget()
	return a.s.Txn(ctx, t)
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}$`)
)

func appPrefix(tenant, app string) string { return "apps/" + tenant + "/" + app + "/" }
func appKey(tenant, app string) string    { return appPrefix(tenant, app) + "app" }
func relKey(tenant, app, v string) string { return appPrefix(tenant, app) + "rel/" + v }
func pinPrefix(tenant, app string) string { return appPrefix(tenant, app) + "pin/" }
func pinKey(tenant, app, scope, target string) string {
	return pinPrefix(tenant, app) + scope + "/" + target
}

func getJSON(ctx context.Context, s store.Store, key string, v any) (store.KV, error) {
	kv, err := s.Get(ctx, key)
	if err != nil {
		return kv, err
	}
	return kv, json.Unmarshal(kv.Value, v)
}

func rangeJSON[T any](ctx context.Context, s store.Store, prefix string, keep func(key string) bool) ([]T, error) {
	kvs, _, err := s.Range(ctx, prefix, 0)
	if err != nil {
		return nil, err
	}
	var out []T
	for _, kv := range kvs {
		if keep != nil && !keep(kv.Key) {
			continue
		}
		var v T
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return nil, fmt.Errorf("apps: %s: %w", kv.Key, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// create writes key only if it does not exist yet, with the audit entry e.
func (a *Apps) create(ctx context.Context, key string, v any, what string, e audit.Entry) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	res, err := a.txn(ctx, store.Txn{If: []store.Cmp{{Key: key, ModRevision: 0}},
		Then: []store.Op{{Key: key, Value: raw}, audit.Op(a.now(), e)}})
	if err != nil {
		return err
	}
	if !res.Succeeded {
		return errdefs.Conflict("%s exists already", what)
	}
	return nil
}

// CreateApp adds an app to the tenant's catalogue.
func (a *Apps) CreateApp(ctx context.Context, who audit.Actor, name, description string) (App, error) {
	if !nameRE.MatchString(name) {
		return App{}, errdefs.Invalid("app name %q: use 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit", name)
	}
	if len(description) > 1024 {
		return App{}, errdefs.Invalid("description is longer than 1024 bytes")
	}
	app := App{TenantID: who.TenantID, Name: name, Description: description, CreatedAt: a.now().UTC(), CreatedBy: who.Name}
	return app, a.create(ctx, appKey(who.TenantID, name), app, "app "+name, who.Did("app.create", name, ""))
}

// App returns one app.
func (a *Apps) App(ctx context.Context, tenant, name string) (App, error) {
	var app App
	if !nameRE.MatchString(name) {
		return app, errdefs.NotFound("no app %q", name)
	}
	_, err := getJSON(ctx, a.s, appKey(tenant, name), &app)
	if errors.Is(err, store.ErrNotFound) {
		return app, errdefs.NotFound("no app %q; 'edgebox app ls' lists them", name)
	}
	return app, err
}

// Apps lists the tenant's apps by name.
func (a *Apps) Apps(ctx context.Context, tenant string) ([]App, error) {
	return rangeJSON[App](ctx, a.s, "apps/"+tenant+"/", func(k string) bool { return strings.HasSuffix(k, "/app") })
}

// DeleteApp removes an app and its releases; an app still pinned anywhere
// stays.
func (a *Apps) DeleteApp(ctx context.Context, who audit.Actor, name string) error {
	if _, err := a.App(ctx, who.TenantID, name); err != nil {
		return err
	}
	pins, err := a.Pins(ctx, who.TenantID, name)
	if err != nil {
		return err
	}
	if len(pins) > 0 {
		return errdefs.Conflict("app %s is deployed (%s %s); undeploy it everywhere first", name, pins[0].Scope, pins[0].Target)
	}
	kvs, _, err := a.s.Range(ctx, appPrefix(who.TenantID, name), 0)
	if err != nil {
		return err
	}
	if len(kvs) == 0 {
		return errdefs.NotFound("no app %q", name)
	}
	// Guarded on every key read, so that of two deletes only the one that
	// removed the app is recorded.
	var t store.Txn
	for _, kv := range kvs {
		t.If = append(t.If, store.Cmp{Key: kv.Key, ModRevision: kv.ModRevision})
		t.Then = append(t.Then, store.Op{Key: kv.Key, Delete: true})
	}
	t.Then = append(t.Then, audit.Op(a.now(), who.Did("app.delete", name, "")))
	res, err := a.txn(ctx, t)
	if err != nil {
		return err
	}
	if !res.Succeeded {
		return errdefs.Conflict("app %s changed while it was being deleted; try again", name)
	}
	return nil
}

// CreateRelease adds an immutable release to an app. A containerd or qemu
// image must be in the console's registry; a tag is resolved to its digest
// now, so the release runs the same bytes wherever and whenever it is
// deployed.
func (a *Apps) CreateRelease(ctx context.Context, who audit.Actor, app string, spec Spec) (Release, error) {
	if _, err := a.App(ctx, who.TenantID, app); err != nil {
		return Release{}, err
	}
	if err := validateSpec(spec); err != nil {
		return Release{}, err
	}
	rel := Release{TenantID: who.TenantID, App: app, Spec: spec, CreatedAt: a.now().UTC(), CreatedBy: who.Name}
	if spec.Runtime != edgeboxv1.RuntimeProcess {
		image, tag, err := a.resolveImage(ctx, who.TenantID, spec.Image)
		if err != nil {
			return Release{}, err
		}
		rel.Image, rel.Tag = image, tag
	}
	return rel, a.create(ctx, relKey(who.TenantID, app, spec.Version), rel, "release "+app+"@"+spec.Version,
		who.Did("release.create", app+"@"+spec.Version, rel.Image))
}

// resolveImage turns an operator's reference (with or without the
// console's host, by tag or digest) into the console's host/repo@digest.
// A tenant's releases use images of its own namespace (<tenant>/…) only,
// so its boxes pull nothing of another tenant's; the console's own tenant
// may use any.
func (a *Apps) resolveImage(ctx context.Context, tenant, s string) (image, tag string, err error) {
	ref, err := registry.ParseRef(s)
	if err != nil {
		return "", "", err
	}
	if ref.Host != "" && !a.ours(ref.Host) {
		return "", "", errdefs.Invalid("image %s is not in the console's registry (%s); push it there first, boxes pull only from the console", s, a.hosts[0])
	}
	if ref.Host == "" && strings.HasPrefix(ref.Repo, "library/") && !strings.Contains(s, "library/") {
		ref.Repo = strings.TrimPrefix(ref.Repo, "library/")
	}
	if tenant != auth.ConsoleTenant && !strings.HasPrefix(ref.Repo, tenant+"/") {
		return "", "", errdefs.Invalid("image %s is outside tenant %s's namespace: push it to %s/%s/… and use that", s, tenant, a.hosts[0], tenant)
	}
	d := ref.Digest
	if d == "" {
		if ref.Tag == "" {
			ref.Tag = "latest"
		}
		if d, err = a.images.Resolve(ctx, ref.Repo, ref.Tag); err != nil {
			return "", "", err
		}
	} else if ok, err := a.images.HasManifest(ctx, ref.Repo, d); err != nil {
		return "", "", err
	} else if !ok {
		return "", "", errdefs.NotFound("the console's registry has no %s@%s; push it first", ref.Repo, d)
	}
	return registry.Ref{Host: a.hosts[0], Repo: ref.Repo, Digest: d}.String(), ref.Tag, nil
}

func (a *Apps) ours(host string) bool {
	for _, h := range a.hosts {
		if h == host {
			return true
		}
	}
	return false
}

// Release returns one release of an app.
func (a *Apps) Release(ctx context.Context, tenant, app, version string) (Release, error) {
	var rel Release
	if !versionRE.MatchString(version) {
		return rel, errdefs.NotFound("app %s has no release %q", app, version)
	}
	_, err := getJSON(ctx, a.s, relKey(tenant, app, version), &rel)
	if errors.Is(err, store.ErrNotFound) {
		return rel, errdefs.NotFound("app %s has no release %q; 'edgebox release ls %s' lists them", app, version, app)
	}
	return rel, err
}

// Releases lists an app's releases, oldest first.
func (a *Apps) Releases(ctx context.Context, tenant, app string) ([]Release, error) {
	if _, err := a.App(ctx, tenant, app); err != nil {
		return nil, err
	}
	rels, err := rangeJSON[Release](ctx, a.s, appPrefix(tenant, app)+"rel/", nil)
	sort.SliceStable(rels, func(i, j int) bool { return rels[i].CreatedAt.Before(rels[j].CreatedAt) })
	return rels, err
}

// Pins lists where an app is pinned.
func (a *Apps) Pins(ctx context.Context, tenant, app string) ([]Pin, error) {
	return rangeJSON[Pin](ctx, a.s, pinPrefix(tenant, app), nil)
}

func validScope(scope, target string) error {
	switch scope {
	case ScopeRegion, ScopeSite:
		if err := fleet.ValidatePlace(scope, target); err != nil || target == "" {
			return errdefs.Invalid("%s %q: not a valid %s name", scope, target, scope)
		}
	case ScopeBox:
		if !nameRE.MatchString(target) {
			return errdefs.Invalid("box %q: not a box ID", target)
		}
	default:
		return errdefs.Invalid("scope %q: use region, site or box", scope)
	}
	return nil
}

// Outcome is what a deploy or undeploy did to the boxes it covers.
type Outcome struct {
	// Changed are the boxes whose desired state changed.
	Changed []string
	// Problems say what could not be done now, box by box (no free key
	// for a release that needs one, a store error); the periodic sync
	// tries again.
	Problems []string
}

// Deploy pins app to version on scope/target and brings every box it
// covers to its effective release. The error is about the pin only: the
// pin and its audit entry are written together; the boxes follow. A pin
// whose release would publish a host port another app publishes on a box
// it covers is refused (ErrConflict), naming the box and the other app.
func (a *Apps) Deploy(ctx context.Context, who audit.Actor, app, version, scope, target string) (Pin, Outcome, error) {
	if err := validScope(scope, target); err != nil {
		return Pin{}, Outcome{}, err
	}
	if _, err := a.Release(ctx, who.TenantID, app, version); err != nil {
		return Pin{}, Outcome{}, err
	}
	if scope == ScopeBox {
		if _, err := a.boxes.Box(ctx, who.TenantID, target); err != nil {
			return Pin{}, Outcome{}, err
		}
	}
	pin := Pin{TenantID: who.TenantID, App: app, Scope: scope, Target: target, Version: version, At: a.now().UTC(), By: who.Name}
	if err := a.checkHostPorts(ctx, pin); err != nil {
		return Pin{}, Outcome{}, err
	}
	raw, _ := json.Marshal(pin)
	if _, err := a.txn(ctx, store.Txn{Then: []store.Op{{Key: pinKey(who.TenantID, app, scope, target), Value: raw},
		audit.Op(a.now(), who.Did("app.deploy", app+"@"+version, scope+" "+target))}}); err != nil {
		return Pin{}, Outcome{}, err
	}
	return pin, a.syncPinned(ctx, who.TenantID, scope, target), nil
}

// checkHostPorts refuses pin when, on a box it covers, its release would
// publish a host port another app there publishes: the box could run
// only one of them. (Two deploys at once can still both pass; the box
// then refuses the second workload and says so in its status.)
func (a *Apps) checkHostPorts(ctx context.Context, pin Pin) error {
	c, err := a.catalogue(ctx, pin.TenantID)
	if err != nil {
		return err
	}
	if rel := c.releases[pin.App+"@"+pin.Version]; len(publishedPorts(rel.Ports)) == 0 {
		return nil
	}
	before := c
	after := c
	after.pins = nil
	for _, p := range c.pins {
		if p.App != pin.App || p.Scope != pin.Scope || p.Target != pin.Target {
			after.pins = append(after.pins, p)
		}
	}
	after.pins = append(after.pins, pin)
	boxes, err := a.boxes.Boxes(ctx, pin.TenantID)
	if err != nil {
		return err
	}
	var clashes []string
	for _, b := range boxes {
		if !covers(pin.Scope, pin.Target, b) || b.State == fleet.StateRevoked {
			continue
		}
		eff, err := after.effective(b)
		if err != nil {
			continue // a pin to a release that is gone; the sync reports it
		}
		// A box whose release of the app this pin does not change (a
		// narrower pin wins there) is left out.
		if was, err := before.effective(b); err == nil {
			if w, ok := was[pin.App]; ok && w.Version == eff[pin.App].Version {
				continue
			}
		}
		clashes = append(clashes, hostPortClashes(b, pin.App, eff)...)
	}
	if len(clashes) == 0 {
		return nil
	}
	const shown = 5
	more := ""
	if len(clashes) > shown {
		more = fmt.Sprintf("; and %d more", len(clashes)-shown)
		clashes = clashes[:shown]
	}
	return errdefs.Conflict("%s@%s cannot run beside what %s %s runs: %s%s; publish another host port, or undeploy the other app there",
		pin.App, pin.Version, pin.Scope, pin.Target, strings.Join(clashes, "; "), more)
}

// syncPinned brings the boxes of a scope whose pin changed along.
func (a *Apps) syncPinned(ctx context.Context, tenant, scope, target string) Outcome {
	changed, err := a.SyncScope(ctx, tenant, scope, target)
	out := Outcome{Changed: changed}
	if err != nil {
		a.log.Warn("some boxes are not yet as their pins say; the periodic sync tries again", "scope", scope, "target", target, "err", err)
		for _, e := range unjoin(err) {
			out.Problems = append(out.Problems, e.Error())
		}
	}
	return out
}

// unjoin lists the errors errors.Join put together, recursively.
func unjoin(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, unjoin(e)...)
	}
	return out
}

// Undeploy removes app's pin on scope/target; the boxes it covered fall
// back to a wider pin, or stop running the app.
func (a *Apps) Undeploy(ctx context.Context, who audit.Actor, app, scope, target string) (Outcome, error) {
	if err := validScope(scope, target); err != nil {
		return Outcome{}, err
	}
	key := pinKey(who.TenantID, app, scope, target)
	kv, err := a.s.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return Outcome{}, errdefs.NotFound("app %s is not pinned on %s %s", app, scope, target)
	} else if err != nil {
		return Outcome{}, err
	}
	// Guarded, so that of two undeploys only the one that removed the pin
	// is recorded.
	res, err := a.txn(ctx, store.Txn{If: []store.Cmp{{Key: key, ModRevision: kv.ModRevision}},
		Then: []store.Op{{Key: key, Delete: true}, audit.Op(a.now(), who.Did("app.undeploy", app, scope+" "+target))}})
	if err != nil {
		return Outcome{}, err
	}
	if !res.Succeeded {
		return Outcome{}, errdefs.Conflict("the pin of app %s on %s %s changed meanwhile; try again", app, scope, target)
	}
	return a.syncPinned(ctx, who.TenantID, scope, target), nil
}

func covers(scope, target string, b fleet.Box) bool {
	switch scope {
	case ScopeRegion:
		return b.Region == target
	case ScopeSite:
		return b.Site == target
	case ScopeBox:
		return b.ID == target
	}
	return false
}

// SyncScope brings every box scope/target covers to its effective
// releases and returns those whose desired state changed.
func (a *Apps) SyncScope(ctx context.Context, tenant, scope, target string) ([]string, error) {
	var boxes []fleet.Box
	if scope == ScopeBox {
		// One box: read it alone, not the fleet (a rollout pins boxes
		// one by one).
		b, err := a.boxes.Box(ctx, tenant, target)
		if err != nil {
			return nil, err
		}
		boxes = []fleet.Box{b}
	} else {
		var err error
		if boxes, err = a.boxes.Boxes(ctx, tenant); err != nil {
			return nil, err
		}
	}
	c, err := a.catalogue(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var changed []string
	var errs []error
	for _, b := range boxes {
		if !covers(scope, target, b) {
			continue
		}
		n, err := a.syncBox(ctx, b, c)
		if err != nil {
			errs = append(errs, fmt.Errorf("box %s: %w", b.ID, err))
		}
		if n > 0 {
			changed = append(changed, b.ID)
		}
	}
	return changed, errors.Join(errs...)
}

// catalogue is one read of a tenant's apps, releases and pins: a sync of
// many boxes reads the store once, not once a box. One from the memo is
// shared by every hello: read it, never change it.
type catalogue struct {
	apps     map[string]bool
	releases map[string]Release // "app@version"
	pins     []Pin
}

func (a *Apps) catalogue(ctx context.Context, tenant string) (catalogue, error) {
	c := catalogue{apps: map[string]bool{}, releases: map[string]Release{}}
	kvs, _, err := a.s.Range(ctx, "apps/"+tenant+"/", 0)
	if err != nil {
		return c, err
	}
	for _, kv := range kvs {
		switch {
		case strings.HasSuffix(kv.Key, "/app"):
			var app App
			if err := json.Unmarshal(kv.Value, &app); err != nil {
				return c, fmt.Errorf("apps: %s: %w", kv.Key, err)
			}
			c.apps[app.Name] = true
		case strings.Contains(kv.Key, "/rel/"):
			var r Release
			if err := json.Unmarshal(kv.Value, &r); err != nil {
				return c, fmt.Errorf("apps: %s: %w", kv.Key, err)
			}
			c.releases[r.App+"@"+r.Version] = r
		case strings.Contains(kv.Key, "/pin/"):
			var p Pin
			if err := json.Unmarshal(kv.Value, &p); err != nil {
				return c, fmt.Errorf("apps: %s: %w", kv.Key, err)
			}
			c.pins = append(c.pins, p)
		}
	}
	return c, nil
}

// effective returns, per app, the release box should run: its box pin,
// else its site's, else its region's.
func (c catalogue) effective(b fleet.Box) (map[string]Release, error) {
	rank := map[string]int{ScopeRegion: 1, ScopeSite: 2, ScopeBox: 3}
	best := map[string]Pin{}
	for _, p := range c.pins {
		if covers(p.Scope, p.Target, b) && rank[p.Scope] > rank[best[p.App].Scope] {
			best[p.App] = p
		}
	}
	out := map[string]Release{}
	for app, p := range best {
		rel, ok := c.releases[app+"@"+p.Version]
		if !ok {
			return nil, errdefs.NotFound("app %s is pinned to release %s, which is gone", app, p.Version)
		}
		out[app] = rel
	}
	return out, nil
}

// Versions returns the release of app each of boxes should run now, by
// box ID; a box that should not run it is left out.
func (a *Apps) Versions(ctx context.Context, tenant, app string, boxes []fleet.Box) (map[string]string, error) {
	c, err := a.catalogue(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, b := range boxes {
		eff, err := c.effective(b)
		if err != nil {
			continue // a pin to a release that is gone: not a box to move
		}
		if rel, ok := eff[app]; ok {
			out[b.ID] = rel.Version
		}
	}
	return out, nil
}

// Effective returns, per app, the release box should run.
func (a *Apps) Effective(ctx context.Context, b fleet.Box) (map[string]Release, error) {
	c, err := a.catalogue(ctx, b.TenantID)
	if err != nil {
		return nil, err
	}
	return c.effective(b)
}

// SyncBox writes box's Workload objects for the releases it should run
// and removes those of apps it should no longer run. Objects already
// right are left alone, so a sync changes revisions only when something
// changed. It returns the number of objects written or removed.
func (a *Apps) SyncBox(ctx context.Context, b fleet.Box) (int, error) {
	// Every box's hello comes here: the tenant's catalogue is read once
	// and kept until it changes, not read whole at each hello.
	c, err := a.catalogues.Get(ctx, b.TenantID, func(ctx context.Context) (catalogue, error) { return a.catalogue(ctx, b.TenantID) })
	if err != nil {
		return 0, err
	}
	return a.syncBox(ctx, b, c)
}

func (a *Apps) syncBox(ctx context.Context, b fleet.Box, c catalogue) (int, error) {
	if b.State != fleet.StateApproved {
		return 0, nil
	}
	eff, err := c.effective(b)
	if err != nil {
		return 0, err
	}
	live, _, err := a.desired.Live(ctx, b.ID)
	if err != nil {
		return 0, err
	}
	have := map[string]*edgeboxv1.Workload{}
	for _, o := range live {
		if w := o.GetWorkload(); w != nil {
			have[o.GetName()] = w
		}
	}
	n := 0
	var errs []error
	deployer := audit.Actor{TenantID: b.TenantID, Name: "deploy"}
	// Removals first, so the keys they free can go to the apps that need
	// them. An app's workload is named for the app; one whose app is no
	// longer pinned here goes. Workloads put by hand (another name, or no app of
	// that name) stay.
	for name, w := range have {
		if _, keep := eff[name]; keep || w.GetApp() != name || !c.apps[name] {
			continue
		}
		if _, err := a.desired.Delete(ctx, b.ID, edgeboxv1.KindWorkload, name); err != nil {
			errs = append(errs, err)
			continue
		}
		if a.keys != nil {
			// The keys it held go back to the pool.
			if err := a.keys.EnsureLeases(ctx, deployer, b.ID, name, nil); err != nil {
				errs = append(errs, err)
			}
		}
		n++
	}
	for app, rel := range eff {
		if a.keys != nil && len(rel.Keys) > 0 {
			needs := make([]map[string]string, 0, len(rel.Keys))
			for _, k := range rel.Keys {
				needs = append(needs, k.Labels)
			}
			if err := a.keys.EnsureLeases(ctx, deployer, b.ID, app, needs); err != nil {
				errs = append(errs, err)
			}
		}
		w := rel.Workload()
		if proto.Equal(have[app], w) {
			continue
		}
		if _, err := a.desired.Put(ctx, b.ID, &edgeboxv1.DesiredObject{Name: app, Spec: &edgeboxv1.DesiredObject_Workload{Workload: w}}); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// SyncAll brings every box of every tenant to its effective releases: the
// safety net behind the syncs that pins and boxes trigger.
func (a *Apps) SyncAll(ctx context.Context, tenants []string) error {
	var errs []error
	for _, t := range tenants {
		boxes, err := a.boxes.Boxes(ctx, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c, err := a.catalogue(ctx, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, b := range boxes {
			if _, err := a.syncBox(ctx, b, c); err != nil {
				errs = append(errs, fmt.Errorf("box %s: %w", b.ID, err))
			}
		}
	}
	return errors.Join(errs...)
}
