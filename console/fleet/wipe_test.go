package fleet

import (
	"context"
	"errors"
	"testing"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/errdefs"
)

// TestWipeIsRecorded: a box revoked to be wiped is revoked at once and
// refused; the box's answer is kept in its record, as a restarted console
// reads it, and in an audit entry whose result is the wipe's. A box revoked
// already, or one never asked, cannot be wiped or recorded as wiped.
func TestWipeIsRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, s := openFleet(t)
	tok := newToken(t, f, 2)
	box, other := enrollBox(t, f, tok), enrollBox(t, f, tok)
	if _, err := f.RecordWipe(ctx, admin, box.ID, Wipe{Result: WipeConfirmed}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a wipe recorded for a box never asked: %v", err)
	}
	b, err := f.RevokeToWipe(ctx, admin, box.ID)
	if err != nil || b.State != StateRevoked || b.Wipe == nil || b.Wipe.Result != WipeAsked || !f.IsRevoked(box.ID) {
		t.Fatalf("revoke to wipe: %+v %v", b, err)
	}
	if _, err := f.RevokeToWipe(ctx, admin, box.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a second wipe of a revoked box: %v", err)
	}
	if _, err := f.Revoke(ctx, admin, other.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.RevokeToWipe(ctx, admin, other.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a wipe of a box revoked without one: %v", err)
	}
	w := Wipe{Confirmed: true, Result: WipeConfirmed, WorkloadsRemoved: []string{"robot"}, KeysReleased: []string{"k-1"}}
	if _, err := f.RecordWipe(ctx, admin, box.ID, w); err != nil {
		t.Fatal(err)
	}

	// As a restarted console reads it.
	if f, err = New(ctx, s, nil); err != nil {
		t.Fatal(err)
	}
	b, err = f.BoxByID(ctx, box.ID)
	if err != nil || b.Wipe == nil || !b.Wipe.Confirmed || b.Wipe.AskedBy != admin.Name || b.Wipe.AnsweredAt.IsZero() ||
		b.Wipe.AskedAt.IsZero() || !f.IsRevoked(box.ID) {
		t.Fatalf("after a restart: %+v %v", b.Wipe, err)
	}
	es, err := audit.New(s, nil).List(ctx, audit.Query{TenantID: admin.TenantID, Target: box.ID})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]audit.Entry{}
	for _, e := range es {
		got[e.Action] = e
	}
	if e := got["box.revoke"]; e.Detail != "wipe asked" || e.Result != "ok" {
		t.Errorf("audit box.revoke: %+v", e)
	}
	if e := got["box.wipe"]; e.Result != "wiped" || e.Detail != "workloads removed: 1 (robot); keys released: 1 (k-1)" {
		t.Errorf("audit box.wipe: %+v", e)
	}
}
