package desired

import (
	"testing"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/audit/audittest"
	"github.com/edgebox/edgebox/console/store/storetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestOperatorChangesAreAuditedInTheirTransaction: each of an operator's
// changes leaves exactly one audit entry, with who asked, from where and
// what changed; when the entry cannot be written, the change fails and
// leaves nothing.
func TestOperatorChangesAreAuditedInTheirTransaction(t *testing.T) {
	t.Parallel()
	s := audittest.Wrap(storetest.Bolt(t))
	st := New(s)
	who := audit.Actor{TenantID: "acme", Name: "token:ops", Remote: "192.0.2.7"}
	// The cases run in order, each on the state the one before left.
	for _, tc := range []struct {
		name, action, detail string
		op                   func() (uint64, error)
		rev                  uint64 // the box's revision after the op
		live                 int    // the box's objects after the op
	}{
		{name: "put new", action: ActionPut, detail: "Workload/a at revision 1", rev: 1, live: 1,
			op: func() (uint64, error) { return st.PutBy(ctx, who, "bx-1", workload("a", "1")) }},
		{name: "put changed", action: ActionPut, detail: "Workload/a at revision 2", rev: 2, live: 1,
			op: func() (uint64, error) { return st.PutBy(ctx, who, "bx-1", workload("a", "2")) }},
		{name: "put other", action: ActionPut, detail: "Workload/b at revision 3", rev: 3, live: 2,
			op: func() (uint64, error) { return st.PutBy(ctx, who, "bx-1", workload("b", "1")) }},
		{name: "delete", action: ActionDelete, detail: "Workload/a at revision 4", rev: 4, live: 1,
			op: func() (uint64, error) { return st.DeleteBy(ctx, who, "bx-1", edgeboxv1.KindWorkload, "a") }},
		{name: "delete a tombstone", action: ActionDelete, detail: "Workload/a at revision 4", rev: 4, live: 1,
			op: func() (uint64, error) { return st.DeleteBy(ctx, who, "bx-1", edgeboxv1.KindWorkload, "a") }},
		{name: "delete missing", action: ActionDelete, detail: "UsbAssignment/x at revision 4", rev: 4, live: 1,
			op: func() (uint64, error) { return st.DeleteBy(ctx, who, "bx-1", edgeboxv1.KindUsbAssignment, "x") }},
		{name: "delete on a box with no state", action: ActionDelete, detail: "Workload/a at revision 0",
			op: func() (uint64, error) { return st.DeleteBy(ctx, who, "bx-2", edgeboxv1.KindWorkload, "a") }},
	} {
		var rev uint64
		e := audittest.One(t, s, tc.action, func() (err error) {
			rev, err = tc.op()
			return err
		})
		box := "bx-1"
		if tc.rev == 0 {
			box = "bx-2"
		}
		want := audit.Entry{Seq: e.Seq, Time: e.Time, TenantID: "acme", Actor: "token:ops", Remote: "192.0.2.7",
			Action: tc.action, Target: box, Result: "ok", Detail: tc.detail}
		if e != want {
			t.Errorf("%s: entry %+v, want %+v", tc.name, e, want)
		}
		live, cur, err := st.Live(ctx, box)
		if err != nil || rev != tc.rev || cur != tc.rev || len(live) != tc.live {
			t.Errorf("%s: returned revision %d; box at %d with %d objects (%v); want %d with %d", tc.name, rev, cur, len(live), err, tc.rev, tc.live)
		}
	}
}

// TestFollowingWritesAreNotAudited: Put and Delete, the writes that
// follow from a change audited where it was made (a pin, a lease), add no
// entry of their own.
func TestFollowingWritesAreNotAudited(t *testing.T) {
	t.Parallel()
	s := storetest.Bolt(t)
	st := New(s)
	if _, err := st.Put(ctx, "bx-1", workload("a", "1")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Delete(ctx, "bx-1", edgeboxv1.KindWorkload, "a"); err != nil {
		t.Fatal(err)
	}
	if es := audittest.Entries(t, s); len(es) != 0 {
		t.Fatalf("unaudited writes left entries: %+v", es)
	}
}
