package db

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/boltdb"
)

// oldConsole is what a schema-1 console kept in its buckets.
type oldConsole struct {
	boxes  []fleet.Box
	tokens []fleet.EnrollToken
	api    map[string]auth.APIToken // by SHA-256 hex
	audit  []audit.Entry
}

func newOldConsole() oldConsole {
	at := time.Date(2026, 2, 1, 10, 0, 0, 0, time.UTC)
	o := oldConsole{api: map[string]auth.APIToken{
		"a3f1": {Name: "admin", TenantID: "default", Role: "admin", CreatedAt: at},
		"b7c2": {Name: "ci", TenantID: "bank-b", Role: "admin", CreatedAt: at},
	}}
	for i := range 120 { // more than two chunks
		b := fleet.Box{ID: fmt.Sprintf("bx-%03d", i), TenantID: "default", Name: fmt.Sprintf("box-%03d", i),
			Region: "east", Site: "a", State: fleet.StateApproved, EnrolledAt: at, CertNotAfter: at.Add(time.Hour)}
		if i%7 == 0 {
			b.State = fleet.StateRevoked
		}
		o.boxes = append(o.boxes, b)
	}
	o.tokens = []fleet.EnrollToken{{ID: "00aa", TenantID: "default", Region: "east", Site: "a", Uses: 3, Used: 1,
		ExpiresAt: at.Add(time.Hour), CreatedAt: at, CreatedBy: "admin", SecretHash: []byte{1, 2, 3}}}
	for i := range 130 {
		tenant := "default"
		if i%2 == 1 {
			tenant = "bank-b"
		}
		o.audit = append(o.audit, audit.Entry{Seq: uint64(i + 1), Time: at.Add(time.Duration(i) * time.Second), TenantID: tenant,
			Actor: "admin", Action: "box.label", Target: "bx-001", Result: "ok", Detail: fmt.Sprint(i)})
	}
	return o
}

// write writes o into the buckets as a schema-1 console did.
func (o oldConsole) write(t testing.TB, bdb *bolt.DB) {
	t.Helper()
	err := bdb.Update(func(tx *bolt.Tx) error {
		put := func(bucket []byte, k []byte, v any) error {
			b, err := tx.CreateBucketIfNotExists(bucket)
			if err != nil {
				return err
			}
			raw, _ := json.Marshal(v)
			return b.Put(k, raw)
		}
		for _, b := range o.boxes {
			if err := put(Boxes, []byte(b.ID), b); err != nil {
				return err
			}
		}
		for _, tok := range o.tokens {
			if err := put(Tokens, []byte(tok.ID), tok); err != nil {
				return err
			}
		}
		for h, a := range o.api {
			if err := put(APITokens, []byte(h), a); err != nil {
				return err
			}
		}
		for _, e := range o.audit {
			if err := put(Audit, binary.BigEndian.AppendUint64(nil, e.Seq), e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// open returns a database in a fresh directory holding o, and a store on it.
func open(t testing.TB, o oldConsole) (*bolt.DB, store.Store) {
	t.Helper()
	bdb, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o.write(t, bdb)
	st, err := store.OpenBolt(bdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		if err := boltdb.Check(bdb); err != nil {
			t.Errorf("bbolt check: %v", err)
		}
		bdb.Close()
	})
	return bdb, st
}

// check asserts that st holds exactly o, and the old buckets are gone.
func (o oldConsole) check(t *testing.T, bdb *bolt.DB, st store.Store) {
	t.Helper()
	ctx := context.Background()
	fl, err := fleet.New(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"default", "bank-b"} {
		var want []fleet.Box
		for _, b := range o.boxes {
			if b.TenantID == tenant {
				want = append(want, b)
			}
		}
		got, err := fl.Boxes(ctx, tenant)
		if err != nil || len(got) != len(want) || len(want) > 0 && !reflect.DeepEqual(got, want) {
			t.Fatalf("tenant %s: %d boxes (%v), want %d", tenant, len(got), err, len(want))
		}
	}
	for _, b := range o.boxes {
		if fl.IsRevoked(b.ID) != (b.State == fleet.StateRevoked) {
			t.Fatalf("box %s (%s): revoked %t", b.ID, b.State, fl.IsRevoked(b.ID))
		}
	}
	if got, err := fl.Tokens(ctx, "default"); err != nil || !reflect.DeepEqual(got, o.tokens) {
		t.Fatalf("tokens: %+v %v", got, err)
	}
	kvs, _, err := st.Range(ctx, auth.Prefix, 0)
	if err != nil || len(kvs) != len(o.api) {
		t.Fatalf("%d API tokens (%v), want %d", len(kvs), err, len(o.api))
	}
	for _, kv := range kvs {
		var a auth.APIToken
		if err := json.Unmarshal(kv.Value, &a); err != nil || a != o.api[kv.Key[len(auth.Prefix):]] {
			t.Fatalf("API token %s: %+v %v", kv.Key, a, err)
		}
	}
	log := audit.New(st, nil)
	for _, tenant := range []string{"default", "bank-b"} {
		var want []audit.Entry
		for _, e := range o.audit {
			if e.TenantID == tenant {
				want = append(want, e)
			}
		}
		got, err := log.List(ctx, audit.Query{TenantID: tenant, Limit: 1000})
		if err != nil || len(got) != len(want) {
			t.Fatalf("tenant %s: %d audit entries (%v), want %d", tenant, len(got), err, len(want))
		}
		for i := range got {
			got[i].Seq = want[i].Seq // the store's revision now
			if got[i] != want[i] {
				t.Fatalf("audit entry %d of %s: %+v, want %+v", i, tenant, got[i], want[i])
			}
		}
	}
	err = bdb.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{Boxes, Tokens, APITokens, Audit} {
			if tx.Bucket(b) != nil {
				return fmt.Errorf("bucket %s is still there", b)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMoveToStore: a database written by a schema-1 console is moved onto
// the store with nothing lost and nothing doubled, and moving it again
// changes nothing.
func TestMoveToStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOldConsole()
	o.boxes[3].TenantID = "bank-b"
	bdb, st := open(t, o)
	if err := MoveToStore(ctx, bdb, st); err != nil {
		t.Fatal(err)
	}
	o.check(t, bdb, st)
	rev, _ := st.Revision(ctx)
	if err := MoveToStore(ctx, bdb, st); err != nil {
		t.Fatal(err)
	}
	o.check(t, bdb, st)
	if again, _ := st.Revision(ctx); again != rev {
		t.Fatalf("a second move wrote revisions %d to %d", rev+1, again)
	}
}

// TestMoveToStoreAfterACrash: a move cut short after any number of its
// records, or after all of them but before the buckets went, ends as a
// whole one does, when the next start moves again. A record moved and
// changed since is not overwritten.
func TestMoveToStoreAfterACrash(t *testing.T) {
	t.Parallel()
	o := newOldConsole()
	var all [][]store.Op // what the move writes, in its order
	{
		// The records in the order the move takes them: bucket by bucket,
		// in key order.
		bdb, _ := open(t, o)
		err := bdb.View(func(tx *bolt.Tx) error {
			for _, m := range moves {
				err := tx.Bucket(m.bucket).ForEach(func(k, v []byte) error {
					ops, err := m.ops(k, v)
					all = append(all, ops)
					return err
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, cut := range []int{0, 1, moveChunk, moveChunk + 1, len(o.boxes), len(o.boxes) + 2, len(all) - 1, len(all)} {
		t.Run(fmt.Sprint("after ", cut, " records"), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bdb, st := open(t, o)
			for _, ops := range all[:cut] {
				if _, err := st.Txn(ctx, store.Txn{Then: ops}); err != nil {
					t.Fatal(err)
				}
			}
			want := o
			if cut > 0 {
				// The first box, moved, was then labelled by the console.
				fl, err := fleet.New(ctx, st, nil)
				if err != nil {
					t.Fatal(err)
				}
				admin := audit.Actor{TenantID: "default", Name: "admin"}
				b, err := fl.Label(ctx, admin, o.boxes[0].ID, map[string]string{"moved": "yes"})
				if err != nil {
					t.Fatal(err)
				}
				want.boxes = append([]fleet.Box{b}, o.boxes[1:]...)
				e, err := log1(ctx, st, "box.label", b.ID)
				if err != nil {
					t.Fatal(err)
				}
				want.audit = append(append([]audit.Entry(nil), o.audit...), e)
			}
			if err := MoveToStore(ctx, bdb, st); err != nil {
				t.Fatal(err)
			}
			want.check(t, bdb, st)
		})
	}
}

// TestMoveToStoreAfterABucketWent: a move cut short after some buckets
// were moved and deleted ends as a whole one does.
func TestMoveToStoreAfterABucketWent(t *testing.T) {
	t.Parallel()
	o := newOldConsole()
	for done := 1; done < len(moves); done++ {
		t.Run(fmt.Sprint(done, " buckets moved"), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bdb, st := open(t, o)
			for _, m := range moves[:done] {
				if err := m.run(ctx, bdb, st); err != nil {
					t.Fatal(err)
				}
			}
			if err := MoveToStore(ctx, bdb, st); err != nil {
				t.Fatal(err)
			}
			o.check(t, bdb, st)
		})
	}
}

// log1 returns the newest audit entry of the default tenant, checking its
// action and target.
func log1(ctx context.Context, st store.Store, action, target string) (audit.Entry, error) {
	es, err := audit.New(st, nil).List(ctx, audit.Query{TenantID: "default", Limit: 1})
	if err != nil || len(es) != 1 || es[0].Action != action || es[0].Target != target {
		return audit.Entry{}, errdefs.NotFound("newest audit entry %+v (%v), want %s of %s", es, err, action, target)
	}
	return es[0], nil
}
