package audit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
)

func TestListNewestOfOneTenant(t *testing.T) {
	ctx := context.Background()
	st := storetest.Bolt(t)
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := audit.New(st, func() time.Time { clock = clock.Add(time.Second); return clock })
	alice := audit.Actor{TenantID: "bank-a", Name: "alice", Remote: "10.0.0.1"}
	// More than one page of the store's scan, with every third about box-1.
	for i := range 600 {
		target := "box-2"
		if i%3 == 0 {
			target = "box-1"
		}
		if err := l.Append(ctx, alice.Did("box.label", target, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Append(ctx, audit.Actor{TenantID: "bank-b", Name: "bob"}.Did("box.label", "box-1", "other tenant")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q          audit.Query
		n          int
		first, end string
	}{
		{audit.Query{TenantID: "bank-a"}, 100, "500", "599"},
		{audit.Query{TenantID: "bank-a", Limit: 1000}, 600, "0", "599"},
		{audit.Query{TenantID: "bank-a", Target: "box-1", Limit: 150}, 150, "150", "597"},
		{audit.Query{TenantID: "bank-b"}, 1, "other tenant", "other tenant"},
	} {
		es, err := l.List(ctx, c.q)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) != c.n || es[0].Detail != c.first || es[len(es)-1].Detail != c.end {
			t.Errorf("%+v: %d entries from %q to %q, want %d from %q to %q", c.q, len(es), es[0].Detail, es[len(es)-1].Detail, c.n, c.first, c.end)
		}
		for i := 1; i < len(es); i++ {
			if es[i].Seq <= es[i-1].Seq || !es[i].Time.After(es[i-1].Time) {
				t.Fatalf("%+v: entries out of order at %d", c.q, i)
			}
		}
	}
	all, _ := l.List(ctx, audit.Query{TenantID: "bank-a", Limit: 1000})
	after, err := l.List(ctx, audit.Query{TenantID: "bank-a", After: all[589].Seq})
	if err != nil || len(after) != 10 || after[0].Detail != "590" {
		t.Fatalf("after entry 589: %d entries, %v", len(after), err)
	}
	e := all[0]
	if e.Actor != "alice" || e.Remote != "10.0.0.1" || e.Action != "box.label" || e.Result != "ok" || e.TenantID != "bank-a" {
		t.Fatalf("entry %+v", e)
	}
	if _, err := l.List(ctx, audit.Query{}); err == nil {
		t.Fatal("a list without a tenant was answered")
	}
}

func TestEntryCommitsWithItsChange(t *testing.T) {
	ctx := context.Background()
	st := storetest.Bolt(t)
	l := audit.New(st, nil)
	who := audit.Actor{TenantID: "default", Name: "admin"}
	// The change's guard fails: neither the change nor its entry lands.
	res, err := st.Txn(ctx, store.Txn{If: []store.Cmp{{Key: "thing", ModRevision: 99}},
		Then: []store.Op{{Key: "thing", Value: []byte("x")}, audit.Op(time.Now(), who.Did("thing.set", "thing", ""))}})
	if err != nil || res.Succeeded {
		t.Fatalf("guarded txn: %+v %v", res, err)
	}
	if es, _ := l.List(ctx, audit.Query{TenantID: "default"}); len(es) != 0 {
		t.Fatalf("%d entries of a change that did not happen", len(es))
	}
	res, err = st.Txn(ctx, store.Txn{If: []store.Cmp{{Key: "thing", ModRevision: 0}},
		Then: []store.Op{{Key: "thing", Value: []byte("x")}, audit.Op(time.Now(), who.Did("thing.set", "thing", ""))}})
	if err != nil || !res.Succeeded {
		t.Fatalf("txn: %+v %v", res, err)
	}
	es, _ := l.List(ctx, audit.Query{TenantID: "default"})
	if len(es) != 1 || es[0].Seq != uint64(res.Revision) {
		t.Fatalf("entries %+v, want one at revision %d", es, res.Revision)
	}
}

func TestImportWritesOnce(t *testing.T) {
	ctx := context.Background()
	st := storetest.Bolt(t)
	e := audit.Entry{Seq: 7, Time: time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC), TenantID: "default", Actor: "admin", Action: "box.revoke", Result: "ok"}
	for range 2 {
		op := audit.ImportOp(e)
		if _, err := st.Txn(ctx, store.Txn{If: []store.Cmp{{Key: op.Key}}, Then: []store.Op{op}}); err != nil {
			t.Fatal(err)
		}
	}
	es, err := audit.New(st, nil).List(ctx, audit.Query{TenantID: "default"})
	if err != nil || len(es) != 1 || !es[0].Time.Equal(e.Time) || es[0].Action != "box.revoke" {
		t.Fatalf("imported twice: %+v %v", es, err)
	}
}
