package agentrel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/edgebox/edgebox/agent/update"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Pin scopes, as apps name them.
const (
	ScopeRegion = "region"
	ScopeSite   = "site"
	ScopeBox    = "box"
)

// Pins lists tenant's agent pins.
func (s *Service) Pins(ctx context.Context, tenant string) ([]Pin, error) {
	kvs, _, err := s.s.Range(ctx, "agent-pins/"+tenant+"/", 0)
	if err != nil {
		return nil, err
	}
	out := make([]Pin, 0, len(kvs))
	for _, kv := range kvs {
		var p Pin
		if err := json.Unmarshal(kv.Value, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", kv.Key, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// pinTxn applies t, a change of pins; whatever came of it, the kept pins
// are dropped, so this console reads its own writes at once.
func (s *Service) pinTxn(ctx context.Context, t store.Txn) (store.TxnResult, error) {
	defer s.pins.Forget()
	return s.s.Txn(ctx, t)
}

func validScope(scope, target string) error {
	switch scope {
	case ScopeRegion, ScopeSite:
		if err := fleet.ValidatePlace(scope, target); err != nil || target == "" {
			return errdefs.Invalid("%s %q: not a valid %s name", scope, clip(target), scope)
		}
	case ScopeBox:
		if !edgeboxv1.ValidObjectName(target) {
			return errdefs.Invalid("box %q: not a box ID", clip(target))
		}
	default:
		return errdefs.Invalid("scope %q: use region, site or box", clip(scope))
	}
	return nil
}

// Pin pins the agent of the boxes scope/target covers in the caller's
// tenant to version, and brings their desired state along. The release
// must have a binary for every covered box's platform.
func (s *Service) Pin(ctx context.Context, who audit.Actor, version, scope, target string) error {
	if err := validScope(scope, target); err != nil {
		return err
	}
	rel, err := s.releaseOrHeld(ctx, version)
	if err != nil {
		return err
	}
	boxes, err := s.covered(ctx, who.TenantID, scope, target)
	if err != nil {
		return err
	}
	for _, b := range boxes {
		if _, ok := rel.Binaries[platformOf(b)]; !ok && rel.Binaries != nil {
			return errdefs.Invalid("agent %s has no %s binary for box %s", version, platformOf(b), b.ID)
		}
	}
	raw, _ := json.Marshal(Pin{TenantID: who.TenantID, Scope: scope, Target: target, Version: version, At: s.now().UTC(), By: who.Name})
	if _, err := s.pinTxn(ctx, store.Txn{Then: []store.Op{{Key: pinKey(who.TenantID, scope, target), Value: raw},
		audit.Op(s.now(), who.Did("agent.pin", version, scope+" "+target))}}); err != nil {
		return err
	}
	return s.syncBoxes(ctx, who.TenantID, boxes)
}

// Unpin removes the agent pin of scope/target; its boxes fall back to a
// wider pin, or keep the version they run.
func (s *Service) Unpin(ctx context.Context, who audit.Actor, scope, target string) error {
	if err := validScope(scope, target); err != nil {
		return err
	}
	key := pinKey(who.TenantID, scope, target)
	kv, err := s.s.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.NotFound("the agent is not pinned on %s %s", scope, target)
	} else if err != nil {
		return err
	}
	res, err := s.pinTxn(ctx, store.Txn{If: []store.Cmp{{Key: key, ModRevision: kv.ModRevision}},
		Then: []store.Op{{Key: key, Delete: true}, audit.Op(s.now(), who.Did("agent.unpin", scope+" "+target, ""))}})
	if err != nil {
		return err
	}
	if !res.Succeeded {
		return errdefs.Conflict("the agent pin on %s %s changed meanwhile; try again", scope, target)
	}
	boxes, err := s.covered(ctx, who.TenantID, scope, target)
	if err != nil {
		return err
	}
	return s.syncBoxes(ctx, who.TenantID, boxes)
}

func (s *Service) covered(ctx context.Context, tenant, scope, target string) ([]fleet.Box, error) {
	if scope == ScopeBox {
		b, err := s.boxes.Box(ctx, tenant, target)
		if err != nil {
			return nil, err
		}
		return []fleet.Box{b}, nil
	}
	all, err := s.boxes.Boxes(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []fleet.Box
	for _, b := range all {
		if covers(scope, target, b) {
			out = append(out, b)
		}
	}
	return out, nil
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

// platformOf is a box's platform as its facts say ("linux/amd64").
func platformOf(b fleet.Box) string { return b.OS + "/" + b.Arch }

// effective is the pin that holds for b: its box's, else its site's,
// else its region's.
func effective(pins []Pin, b fleet.Box) (Pin, bool) {
	rank := map[string]int{ScopeRegion: 1, ScopeSite: 2, ScopeBox: 3}
	var best Pin
	for _, p := range pins {
		if covers(p.Scope, p.Target, b) && rank[p.Scope] > rank[best.Scope] {
			best = p
		}
	}
	return best, best.Scope != ""
}

// releaseOrHeld returns version's release; a version never uploaded is
// one the boxes must hold already (the one they were installed with):
// its release has no binaries (nil), and a box that does not hold it
// says so.
func (s *Service) releaseOrHeld(ctx context.Context, version string) (Release, error) {
	if !update.ValidVersion(version) {
		return Release{}, errdefs.Invalid("agent version %q: not a version", clip(version))
	}
	rel, _, err := s.get(ctx, version)
	if errdefs.Kind(err) == errdefs.ErrNotFound {
		return Release{Version: version}, nil
	}
	return rel, err
}

// Versions returns the agent version each box should run: its pin's, or
// the one it reports running when nothing pins it.
func (s *Service) Versions(ctx context.Context, tenant string, boxes []fleet.Box) (map[string]string, error) {
	pins, err := s.Pins(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, b := range boxes {
		if p, ok := effective(pins, b); ok {
			out[b.ID] = p.Version
		} else if b.AgentVersion != "" {
			out[b.ID] = b.AgentVersion
		}
	}
	return out, nil
}

// SyncAll brings every box of tenants to its agent pins: the net behind
// the syncs that pins and hellos make at once.
func (s *Service) SyncAll(ctx context.Context, tenants []string) error {
	var errs []error
	for _, t := range tenants {
		pins, err := s.Pins(ctx, t)
		if err != nil || len(pins) == 0 {
			errs = append(errs, err)
			continue
		}
		boxes, err := s.boxes.Boxes(ctx, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rels := map[string]Release{}
		for _, b := range boxes {
			if err := s.syncBox(ctx, b, pins, rels); err != nil {
				errs = append(errs, fmt.Errorf("box %s: %w", b.ID, err))
			}
		}
	}
	return errors.Join(errs...)
}

// SyncBox writes box b's AgentRelease object from its pins: the pinned
// version with its platform's binary; no pin removes the object (the
// box keeps what it runs).
func (s *Service) SyncBox(ctx context.Context, b fleet.Box) error {
	// Every box's hello comes here: the tenant's pins are read once and
	// kept until they change.
	pins, err := s.pins.Get(ctx, b.TenantID, func(ctx context.Context) ([]Pin, error) { return s.Pins(ctx, b.TenantID) })
	if err != nil {
		return err
	}
	rels := map[string]Release{}
	if p, ok := effective(pins, b); ok && b.State == fleet.StateApproved {
		// And the release the pin names, kept the same way.
		rel, err := s.releases.Get(ctx, p.Version, func(ctx context.Context) (Release, error) { return s.releaseOrHeld(ctx, p.Version) })
		if err != nil {
			return err
		}
		rels[p.Version] = rel
	}
	return s.syncBox(ctx, b, pins, rels)
}

func (s *Service) syncBoxes(ctx context.Context, tenant string, boxes []fleet.Box) error {
	pins, err := s.Pins(ctx, tenant)
	if err != nil {
		return err
	}
	rels := map[string]Release{}
	var errs []error
	for _, b := range boxes {
		if err := s.syncBox(ctx, b, pins, rels); err != nil {
			errs = append(errs, fmt.Errorf("box %s: %w", b.ID, err))
		}
	}
	return errors.Join(errs...)
}

func (s *Service) syncBox(ctx context.Context, b fleet.Box, pins []Pin, rels map[string]Release) error {
	if b.State != fleet.StateApproved {
		return nil
	}
	live, _, err := s.desired.Live(ctx, b.ID)
	if err != nil {
		return err
	}
	var have *edgeboxv1.AgentRelease
	for _, o := range live {
		if o.GetAgentRelease() != nil && o.GetName() == ObjectName {
			have = o.GetAgentRelease()
		}
	}
	p, ok := effective(pins, b)
	if !ok {
		if have != nil {
			_, err := s.desired.Delete(ctx, b.ID, edgeboxv1.KindAgentRelease, ObjectName)
			return err
		}
		return nil
	}
	rel, ok := rels[p.Version]
	if !ok {
		if rel, err = s.releaseOrHeld(ctx, p.Version); err != nil {
			return err
		}
		rels[p.Version] = rel
	}
	bin, ok := rel.Binaries[platformOf(b)]
	if !ok && rel.Binaries != nil {
		return errdefs.Invalid("agent %s has no %s binary", p.Version, platformOf(b))
	}
	want := &edgeboxv1.AgentRelease{Version: rel.Version, Sha256: bin.SHA256, Signature: bin.Signature,
		ProbationSeconds: uint32(rel.Probation / time.Second)}
	if have != nil && have.GetVersion() == want.GetVersion() && have.GetSha256() == want.GetSha256() &&
		have.GetProbationSeconds() == want.GetProbationSeconds() {
		return nil
	}
	_, err = s.desired.Put(ctx, b.ID, &edgeboxv1.DesiredObject{Kind: edgeboxv1.KindAgentRelease, Name: ObjectName,
		Spec: &edgeboxv1.DesiredObject_AgentRelease{AgentRelease: want}})
	return err
}
