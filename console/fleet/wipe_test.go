package fleet

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// TestWipeIsRecorded: a box revoked to be wiped is revoked at once and
// refused; the box's answer is kept in its record, as a restarted console
// reads it, and
// in an audit entry whose result is the wipe's. A box revoked already, or
// one never asked, cannot be wiped or recorded as wiped.
func TestWipeIsRecorded(t *testing.T) {
	t.Parallel()
	f, bdb := openFleet(t, t.TempDir())
	tok, _, _ := f.CreateToken(admin, TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 2},
		"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	box, _, err := f.Enroll(Enrollment{Token: tok, Issue: issue})
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := f.Enroll(Enrollment{Token: tok, Issue: issue})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.RecordWipe(admin, box.ID, Wipe{Result: WipeConfirmed}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a wipe recorded for a box never asked: %v", err)
	}
	b, err := f.RevokeToWipe(admin, box.ID)
	if err != nil || b.State != StateRevoked || b.Wipe == nil || b.Wipe.Result != WipeAsked || !f.IsRevoked(box.ID) {
		t.Fatalf("revoke to wipe: %+v %v", b, err)
	}
	if _, err := f.RevokeToWipe(admin, box.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a second wipe of a revoked box: %v", err)
	}
	if _, err := f.Revoke(admin, other.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.RevokeToWipe(admin, other.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a wipe of a box revoked without one: %v", err)
	}
	w := Wipe{Confirmed: true, Result: WipeConfirmed, WorkloadsRemoved: []string{"robot"}, KeysReleased: []string{"k-1"}}
	if _, err := f.RecordWipe(admin, box.ID, w); err != nil {
		t.Fatal(err)
	}

	// As a restarted console reads it.
	if f, err = New(bdb, nil); err != nil {
		t.Fatal(err)
	}
	b, err = f.BoxByID(box.ID)
	if err != nil || b.Wipe == nil || !b.Wipe.Confirmed || b.Wipe.AskedBy != admin.Name || b.Wipe.AnsweredAt.IsZero() ||
		b.Wipe.AskedAt.IsZero() || !f.IsRevoked(box.ID) {
		t.Fatalf("after a restart: %+v %v", b.Wipe, err)
	}
	st, err := store.OpenBolt(bdb)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	es, err := audit.New(st, nil).List(context.Background(), audit.Query{TenantID: admin.TenantID, Target: box.ID})
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
