package apps

import (
	"context"

	"github.com/edgebox/edgebox/console/fleet"
)

// KeyChecker is what a preview asks of the keys registry, when the Leaser
// given to New has it: which key needs a workload on a box would find no
// key for.
type KeyChecker interface {
	MissingKeys(ctx context.Context, tenant, box, workload string, needs []map[string]string) ([]string, error)
}

// Impact is what a deploy would do, told before it is made.
type Impact struct {
	// Boxes are the boxes that would run the release: those the scope
	// covers, not revoked, where no narrower pin of the app wins.
	Boxes []fleet.Box
	// Already counts the Boxes whose pins already gave them the release.
	Already int
	// Kept are the boxes the scope covers where a narrower pin wins.
	Kept []fleet.Box
	// MissingKeys gives, per box ID of Boxes, the release's key needs no
	// key of that box meets now.
	MissingKeys map[string][]string
}

// Preview says what Deploy(app, version, scope, target) would do, and
// changes nothing.
func (a *Apps) Preview(ctx context.Context, tenant, app, version, scope, target string) (Impact, error) {
	var im Impact
	if err := validScope(scope, target); err != nil {
		return im, err
	}
	rel, err := a.Release(ctx, tenant, app, version)
	if err != nil {
		return im, err
	}
	c, err := a.catalogue(ctx, tenant)
	if err != nil {
		return im, err
	}
	pin := Pin{TenantID: tenant, App: app, Scope: scope, Target: target, Version: version}
	after := c
	after.pins = nil
	for _, p := range c.pins {
		if p.App != app || p.Scope != scope || p.Target != target {
			after.pins = append(after.pins, p)
		}
	}
	after.pins = append(after.pins, pin)
	boxes, err := a.boxes.Boxes(ctx, tenant)
	if err != nil {
		return im, err
	}
	needs := make([]map[string]string, 0, len(rel.Keys))
	for _, k := range rel.Keys {
		needs = append(needs, k.Labels)
	}
	checker, _ := a.keys.(KeyChecker)
	im.MissingKeys = map[string][]string{}
	for _, b := range boxes {
		if !covers(scope, target, b) || b.State == fleet.StateRevoked {
			continue
		}
		eff, err := after.effective(b)
		if err != nil {
			continue // a pin to a release that is gone; the sync reports it
		}
		if eff[app].Version != version {
			im.Kept = append(im.Kept, b)
			continue
		}
		im.Boxes = append(im.Boxes, b)
		if was, err := c.effective(b); err == nil && was[app].Version == version {
			im.Already++
		}
		if checker != nil && len(needs) > 0 {
			missing, err := checker.MissingKeys(ctx, tenant, b.ID, app, needs)
			if err != nil {
				return im, err
			}
			if len(missing) > 0 {
				im.MissingKeys[b.ID] = missing
			}
		}
	}
	return im, nil
}
