package keys

import (
	"context"
	"testing"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/audit/audittest"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store/storetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestEveryChangeIsAuditedInItsTransaction: each change of a key, by an
// operator or by a deploy's leases, leaves exactly one audit entry with
// its actor's tenant, name and address; when the entry cannot be written,
// the change fails and leaves the key, its history and the box's desired
// state as they were. What a box reports of its keys is not audited.
func TestEveryChangeIsAuditedInItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := audittest.Wrap(storetest.Bolt(t))
	d := desired.New(s)
	r := New(s, d)
	b := fleet.Box{ID: "bx-a", TenantID: "acme"}
	dev := &edgeboxv1.UsbDevice{Port: "1-2", VendorId: "096e", ProductId: "0702", Serial: "S1"}
	id := ID(b.ID, dev)
	if err := r.Report(ctx, b, []*edgeboxv1.UsbDevice{dev}); err != nil {
		t.Fatal(err)
	}
	if err := r.BoxEvent(ctx, b, &edgeboxv1.Event{Name: id, Reason: edgeboxv1.ReasonPowerCycled}); err != nil {
		t.Fatal(err)
	}
	if es := audittest.Entries(t, s); len(es) != 0 {
		t.Fatalf("a box's report and event left audit entries: %+v", es)
	}
	op := audit.Actor{TenantID: "acme", Name: "token:ops", Remote: "203.0.113.9"}
	deployer := audit.Actor{TenantID: "acme", Name: "deploy"}
	need := []map[string]string{{"bank": "icbc"}}
	// The cases run in order, each on what the one before left.
	for _, tc := range []struct {
		name, action, detail string
		who                  audit.Actor
		op                   func() error
		holder               string // the key's holder after the op
	}{
		{name: "label", action: "key.label", who: op,
			op: func() error { _, err := r.Label(ctx, op, id, map[string]string{"bank": "icbc"}); return err }},
		{name: "lease", action: "key.lease", who: op, detail: "to workload robot on box bx-a", holder: "robot",
			op: func() error { _, err := r.Lease(ctx, op, id, "robot"); return err }},
		{name: "release", action: "key.release", who: op, detail: "on box bx-a",
			op: func() error { _, err := r.Release(ctx, op, id); return err }},
		{name: "a deploy's lease", action: "key.lease", who: deployer, detail: "to workload clock on box bx-a", holder: "clock",
			op: func() error { return r.EnsureLeases(ctx, deployer, b.ID, "clock", need) }},
		{name: "a deploy's release", action: "key.release", who: deployer, detail: "on box bx-a",
			op: func() error { return r.EnsureLeases(ctx, deployer, b.ID, "clock", nil) }},
	} {
		e := audittest.One(t, s, tc.action, tc.op)
		want := audit.Entry{Seq: e.Seq, Time: e.Time, TenantID: tc.who.TenantID, Actor: tc.who.Name, Remote: tc.who.Remote,
			Action: tc.action, Target: id, Result: "ok", Detail: tc.detail}
		if e != want {
			t.Errorf("%s: entry %+v, want %+v", tc.name, e, want)
		}
		k, _, err := r.Get(ctx, "acme", id)
		if err != nil || k.Holder != tc.holder || k.Labels["bank"] != "icbc" {
			t.Errorf("%s: key %+v %v; want holder %q", tc.name, k, err, tc.holder)
		}
		// The box is told of the lease, or of its end.
		live, _, err := d.Live(ctx, b.ID)
		if err != nil {
			t.Fatal(err)
		}
		if tc.holder == "" && len(live) != 0 || tc.holder != "" && (len(live) != 1 || live[0].GetUsbAssignment().GetWorkload() != tc.holder) {
			t.Errorf("%s: the box's desired state %v, want the key leased to %q", tc.name, live, tc.holder)
		}
	}
	// A box's reports change the key's history, never the audit log.
	n := len(audittest.Entries(t, s))
	if err := r.Report(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	if k, _, _ := r.Get(ctx, "acme", id); k.State != Absent {
		t.Fatalf("key after a report without it: %+v", k)
	}
	if got := len(audittest.Entries(t, s)); got != n {
		t.Fatalf("a box's report left %d audit entries", got-n)
	}
}
