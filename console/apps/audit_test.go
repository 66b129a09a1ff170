package apps

import (
	"testing"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/audit/audittest"
	"github.com/edgebox/edgebox/console/store/storetest"
)

// TestEveryChangeIsAuditedInItsTransaction: each operation that changes
// the catalogue leaves exactly one audit entry, with the caller's tenant,
// name and address, whoever calls it; the Workload objects a pin brings
// to boxes add none. When the entry cannot be written, the operation
// fails and changes nothing.
func TestEveryChangeIsAuditedInItsTransaction(t *testing.T) {
	t.Parallel()
	who := audit.Actor{TenantID: "acme", Name: "token:ci", Remote: "198.51.100.4"}
	b1, b2 := box("bx-a", "east", "s1"), box("bx-b", "east", "s2")
	b1.TenantID, b2.TenantID = who.TenantID, who.TenantID
	s := audittest.Wrap(storetest.Bolt(t))
	a, _ := newAppsOn(t, s, boxes{b1, b2})
	release := func(v, image string) func() (Outcome, error) {
		return func() (Outcome, error) {
			_, err := a.CreateRelease(ctx, who, "clock", Spec{Version: v, Runtime: "containerd", Image: image})
			return Outcome{}, err
		}
	}
	deploy := func(v, scope, target string) func() (Outcome, error) {
		return func() (Outcome, error) {
			_, out, err := a.Deploy(ctx, who, "clock", v, scope, target)
			return out, err
		}
	}
	undeploy := func(scope, target string) func() (Outcome, error) {
		return func() (Outcome, error) { return a.Undeploy(ctx, who, "clock", scope, target) }
	}
	// The cases run in order, each on what the one before left.
	for _, tc := range []struct {
		action, target, detail string
		op                     func() (Outcome, error)
		changed                int // boxes whose desired state the op changed
	}{
		{action: "app.create", target: "clock",
			op: func() (Outcome, error) { _, err := a.CreateApp(ctx, who, "clock", "a clock"); return Outcome{}, err }},
		{action: "release.create", target: "clock@1", detail: host + "/acme/clock@" + d1.String(), op: release("1", "acme/clock:1")},
		{action: "release.create", target: "clock@2", detail: host + "/acme/clock@" + d2.String(), op: release("2", host+"/acme/clock:2")},
		{action: "app.deploy", target: "clock@1", detail: "region east", changed: 2, op: deploy("1", ScopeRegion, "east")},
		{action: "app.deploy", target: "clock@2", detail: "box bx-b", changed: 1, op: deploy("2", ScopeBox, "bx-b")},
		{action: "app.deploy", target: "clock@1", detail: "box bx-b", changed: 1, op: deploy("1", ScopeBox, "bx-b")},
		{action: "app.undeploy", target: "clock", detail: "box bx-b", changed: 0, op: undeploy(ScopeBox, "bx-b")},
		{action: "app.undeploy", target: "clock", detail: "region east", changed: 2, op: undeploy(ScopeRegion, "east")},
		{action: "app.delete", target: "clock",
			op: func() (Outcome, error) { return Outcome{}, a.DeleteApp(ctx, who, "clock") }},
	} {
		var out Outcome
		e := audittest.One(t, s, tc.action, func() (err error) {
			out, err = tc.op()
			return err
		})
		want := audit.Entry{Seq: e.Seq, Time: e.Time, TenantID: "acme", Actor: "token:ci", Remote: "198.51.100.4",
			Action: tc.action, Target: tc.target, Result: "ok", Detail: tc.detail}
		if e != want {
			t.Errorf("%s: entry %+v, want %+v", tc.action, e, want)
		}
		if len(out.Changed) != tc.changed || len(out.Problems) > 0 {
			t.Errorf("%s %s changed boxes %v, want %d; problems %v", tc.action, tc.detail, out.Changed, tc.changed, out.Problems)
		}
	}
	if apps, err := a.Apps(ctx, who.TenantID); err != nil || len(apps) != 0 {
		t.Fatalf("apps after the delete: %v %v", apps, err)
	}
}
