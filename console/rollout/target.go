package rollout

import (
	"context"
	"errors"

	"github.com/edgebox/edgebox/console/agentrel"
	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Target is what a rollout moves boxes between the versions of: an app's
// releases, or the agent's own (agentrel.App).
type Target interface {
	// Check says why boxes cannot move from one version to the other,
	// and what each box is to pre-pull first (nil: nothing).
	Check(ctx context.Context, tenant, app, from, to string) (*Prefetch, error)
	// Versions returns the version each box should run now, by box ID.
	Versions(ctx context.Context, tenant, app string, boxes []fleet.Box) (map[string]string, error)
	// Pins returns the pins, "scope/target" -> version.
	Pins(ctx context.Context, tenant, app string) (map[string]string, error)
	Pin(ctx context.Context, who audit.Actor, app, version, scope, target string) error
	Unpin(ctx context.Context, who audit.Actor, app, scope, target string) error
	// Sync writes box b's desired state from the pins, and writes
	// nothing when it says what they say already. Pin writes the pin,
	// then the boxes' desired state: a console that died between the two
	// left a pin its box was never told of.
	Sync(ctx context.Context, b fleet.Box) error
	// Status names the object whose status a box reports of the app.
	Status(app string) (kind, name string)
	// Probes reports whether version has probes: a box runs it healthy
	// only once they pass.
	Probes(ctx context.Context, tenant, app, version string) (bool, error)
}

// appTarget moves an app's boxes between its releases.
type appTarget struct{ a *apps.Apps }

func (t appTarget) Check(ctx context.Context, tenant, app, from, to string) (*Prefetch, error) {
	if _, err := t.a.App(ctx, tenant, app); err != nil {
		return nil, err
	}
	var rel apps.Release
	for _, v := range []string{from, to} {
		r, err := t.a.Release(ctx, tenant, app, v)
		if err != nil {
			return nil, err
		}
		rel = r
	}
	if (rel.Runtime == edgeboxv1.RuntimeContainerd || rel.Runtime == edgeboxv1.RuntimeQEMU) && rel.Image != "" {
		return &Prefetch{Runtime: rel.Runtime, Image: rel.Image}, nil
	}
	return nil, nil
}

func (t appTarget) Versions(ctx context.Context, tenant, app string, boxes []fleet.Box) (map[string]string, error) {
	return t.a.Versions(ctx, tenant, app, boxes)
}

func (t appTarget) Pins(ctx context.Context, tenant, app string) (map[string]string, error) {
	pins, err := t.a.Pins(ctx, tenant, app)
	out := map[string]string{}
	for _, p := range pins {
		out[p.Scope+"/"+p.Target] = p.Version
	}
	return out, err
}

func (t appTarget) Pin(ctx context.Context, who audit.Actor, app, version, scope, target string) error {
	_, _, err := t.a.Deploy(ctx, who, app, version, scope, target)
	return err
}

func (t appTarget) Unpin(ctx context.Context, who audit.Actor, app, scope, target string) error {
	_, err := t.a.Undeploy(ctx, who, app, scope, target)
	return err
}

func (t appTarget) Sync(ctx context.Context, b fleet.Box) error {
	_, err := t.a.SyncBox(ctx, b)
	return err
}

func (appTarget) Status(app string) (string, string) { return edgeboxv1.KindWorkload, app }

func (t appTarget) Probes(ctx context.Context, tenant, app, version string) (bool, error) {
	rel, err := t.a.Release(ctx, tenant, app, version)
	return len(rel.Probes) > 0, err
}

// agentTarget moves boxes between versions of their agent.
type agentTarget struct{ r *agentrel.Service }

func (t agentTarget) Check(ctx context.Context, _, _, from, to string) (*Prefetch, error) {
	// To must have been uploaded; From may be the version the boxes were
	// installed with, which they hold.
	if _, err := t.r.Release(ctx, to); err != nil {
		return nil, err
	}
	return nil, nil // the box fetches the binary when it is told
}

func (t agentTarget) Versions(ctx context.Context, tenant, _ string, boxes []fleet.Box) (map[string]string, error) {
	return t.r.Versions(ctx, tenant, boxes)
}

func (t agentTarget) Pins(ctx context.Context, tenant, _ string) (map[string]string, error) {
	pins, err := t.r.Pins(ctx, tenant)
	out := map[string]string{}
	for _, p := range pins {
		out[p.Scope+"/"+p.Target] = p.Version
	}
	return out, err
}

func (t agentTarget) Pin(ctx context.Context, who audit.Actor, _, version, scope, target string) error {
	return t.r.Pin(ctx, who, version, scope, target)
}

func (t agentTarget) Unpin(ctx context.Context, who audit.Actor, _, scope, target string) error {
	return t.r.Unpin(ctx, who, scope, target)
}

func (t agentTarget) Sync(ctx context.Context, b fleet.Box) error { return t.r.SyncBox(ctx, b) }

func (agentTarget) Status(string) (string, string) {
	return edgeboxv1.KindAgentRelease, agentrel.ObjectName
}

func (agentTarget) Probes(context.Context, string, string, string) (bool, error) { return false, nil }

// target returns what moves app's boxes.
func (s *Service) target(app string) (Target, error) {
	if app == agentrel.App {
		if s.agent == nil {
			return nil, errdefs.Unavailable("this console does not release agents")
		}
		return agentTarget{s.agent}, nil
	}
	if s.apps == nil {
		return nil, errors.New("rollout: no app catalogue")
	}
	return appTarget{s.apps}, nil
}

// versionOf is the version a desired object of a target names.
func versionOf(o *edgeboxv1.DesiredObject) string {
	if w := o.GetWorkload(); w != nil {
		return w.GetRelease()
	}
	return o.GetAgentRelease().GetVersion()
}
