// Package storetest is the conformance suite every store.Store passes.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/store"
)

// Suite runs the contract against stores made by newStore; each call must
// return an empty store that is closed when the test ends.
func Suite(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		f    func(t *testing.T, s store.Store)
	}{
		{"PutGetRevisions", testPutGet},
		{"CASCreateUpdateDelete", testCAS},
		{"TxnIsAtomic", testTxnAtomic},
		{"DeleteOfMissingKeyIsNoChange", testDeleteMissing},
		{"RangeByPrefixInOrder", testRange},
		{"WatchFromOldRevision", testWatchHistory},
		{"WatchLiveAndPrefix", testWatchLive},
		{"WatchAfterCompaction", testCompaction},
		{"ConcurrentCAS", testConcurrentCAS},
		{"EmptyKeyRefused", testEmptyKey},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t, newStore(t))
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func put(t *testing.T, s store.Store, k, v string) int64 {
	t.Helper()
	rev, err := store.Put(ctx(t), s, k, []byte(v))
	if err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
	return rev
}

func testPutGet(t *testing.T, s store.Store) {
	if _, err := s.Get(ctx(t), "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get of missing key: %v", err)
	}
	r1 := put(t, s, "a", "1")
	r2 := put(t, s, "a", "2")
	if r2 <= r1 {
		t.Fatalf("revisions %d then %d do not grow", r1, r2)
	}
	kv, err := s.Get(ctx(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	if string(kv.Value) != "2" || kv.CreateRevision != r1 || kv.ModRevision != r2 || kv.Version != 2 {
		t.Fatalf("got %+v, want value 2 created at %d modified at %d version 2", kv, r1, r2)
	}
	if cur, _ := s.Revision(ctx(t)); cur != r2 {
		t.Fatalf("Revision %d, want %d", cur, r2)
	}
}

func testCAS(t *testing.T, s store.Store) {
	res, err := store.CAS(ctx(t), s, "k", 0, []byte("v1"))
	if err != nil || !res.Succeeded {
		t.Fatalf("create-only on a missing key: %+v %v", res, err)
	}
	created := res.Revision
	if res, _ := store.CAS(ctx(t), s, "k", 0, []byte("again")); res.Succeeded {
		t.Fatal("create-only succeeded on an existing key")
	}
	if res, _ := store.CAS(ctx(t), s, "k", created+100, []byte("x")); res.Succeeded {
		t.Fatal("CAS with a wrong revision succeeded")
	}
	res, err = store.CAS(ctx(t), s, "k", created, []byte("v2"))
	if err != nil || !res.Succeeded {
		t.Fatalf("CAS with the right revision: %+v %v", res, err)
	}
	// Delete guarded by revision.
	res, err = s.Txn(ctx(t), store.Txn{If: []store.Cmp{{Key: "k", ModRevision: created}}, Then: []store.Op{{Key: "k", Delete: true}}})
	if err != nil || res.Succeeded {
		t.Fatalf("delete with a stale revision: %+v %v", res, err)
	}
	kv, _ := s.Get(ctx(t), "k")
	res, err = s.Txn(ctx(t), store.Txn{If: []store.Cmp{{Key: "k", ModRevision: kv.ModRevision}}, Then: []store.Op{{Key: "k", Delete: true}}})
	if err != nil || !res.Succeeded {
		t.Fatalf("delete with the current revision: %+v %v", res, err)
	}
	if _, err := s.Get(ctx(t), "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted key still there: %v", err)
	}
}

func testTxnAtomic(t *testing.T, s store.Store) {
	put(t, s, "guard", "g")
	before, _ := s.Revision(ctx(t))
	res, err := s.Txn(ctx(t), store.Txn{
		If:   []store.Cmp{{Key: "guard", ModRevision: before}, {Key: "absent", ModRevision: 0}},
		Then: []store.Op{{Key: "x", Value: []byte("1")}, {Key: "y", Value: []byte("2")}, {Key: "guard", Delete: true}},
	})
	if err != nil || !res.Succeeded || res.Revision != before+1 {
		t.Fatalf("txn: %+v %v; want one new revision %d", res, err, before+1)
	}
	x, _ := s.Get(ctx(t), "x")
	y, _ := s.Get(ctx(t), "y")
	if x.ModRevision != res.Revision || y.ModRevision != res.Revision {
		t.Fatalf("ops of one txn got revisions %d and %d, want %d", x.ModRevision, y.ModRevision, res.Revision)
	}
	// A failing guard applies nothing.
	res, err = s.Txn(ctx(t), store.Txn{
		If:   []store.Cmp{{Key: "x", ModRevision: 1 << 40}},
		Then: []store.Op{{Key: "z", Value: []byte("3")}},
	})
	if err != nil || res.Succeeded {
		t.Fatalf("txn with a failing guard: %+v %v", res, err)
	}
	if _, err := s.Get(ctx(t), "z"); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("a failed txn wrote")
	}
}

func testDeleteMissing(t *testing.T, s store.Store) {
	before := put(t, s, "a", "1")
	rev, err := store.Delete(ctx(t), s, "missing")
	if err != nil {
		t.Fatal(err)
	}
	if rev != before {
		t.Fatalf("deleting nothing moved the revision from %d to %d", before, rev)
	}
}

func testRange(t *testing.T, s store.Store) {
	for _, k := range []string{"box/b/2", "box/a/1", "box/b/1", "boxes", "other"} {
		put(t, s, k, k)
	}
	kvs, rev, err := s.Range(ctx(t), "box/", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range kvs {
		got = append(got, kv.Key)
	}
	if fmt.Sprint(got) != "[box/a/1 box/b/1 box/b/2]" {
		t.Fatalf("range box/: %v", got)
	}
	if cur, _ := s.Revision(ctx(t)); rev != cur {
		t.Fatalf("range revision %d, current %d", rev, cur)
	}
	kvs, _, _ = s.Range(ctx(t), "box/", 2)
	if len(kvs) != 2 {
		t.Fatalf("limit 2 gave %d", len(kvs))
	}
	// Paging with Scan: each page starts after the last key of the one
	// before, and stays in the prefix.
	for _, c := range []struct {
		after string
		limit int
		want  string
	}{
		{"", 2, "[box/a/1 box/b/1]"},
		{"box/b/1", 2, "[box/b/2]"},
		{"box/b/2", 2, "[]"},
		{"box/a", 0, "[box/a/1 box/b/1 box/b/2]"}, // not a key: starts at the next
		{"a", 0, "[box/a/1 box/b/1 box/b/2]"},     // below the prefix
		{"zzz", 0, "[]"},                          // past it
	} {
		kvs, _, err := s.Scan(ctx(t), "box/", c.after, c.limit)
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, kv := range kvs {
			got = append(got, kv.Key)
		}
		if fmt.Sprint(got) != c.want {
			t.Errorf("scan box/ after %q limit %d: %v, want %s", c.after, c.limit, got, c.want)
		}
	}
}

// collect reads events from w until it has n of them.
func collect(t *testing.T, w <-chan store.WatchResponse, n int) []store.Event {
	t.Helper()
	var evs []store.Event
	timeout := time.After(10 * time.Second)
	for len(evs) < n {
		select {
		case r, ok := <-w:
			if !ok {
				t.Fatalf("watch closed after %d of %d events", len(evs), n)
			}
			if r.Err != nil {
				t.Fatalf("watch: %v", r.Err)
			}
			evs = append(evs, r.Events...)
		case <-timeout:
			t.Fatalf("got %d of %d events", len(evs), n)
		}
	}
	return evs
}

func testWatchHistory(t *testing.T, s store.Store) {
	first := put(t, s, "w/a", "1")
	put(t, s, "w/b", "2")
	store.Delete(ctx(t), s, "w/a")
	put(t, s, "x/ignored", "no")
	w := s.Watch(ctx(t), "w/", first)
	evs := collect(t, w, 3)
	want := []string{"put w/a 1", "put w/b 2", "delete w/a "}
	for i, e := range evs {
		if got := fmt.Sprintf("%s %s %s", e.Type, e.KV.Key, e.KV.Value); got != want[i] {
			t.Fatalf("event %d: %q, want %q", i, got, want[i])
		}
		if i > 0 && e.KV.ModRevision <= evs[i-1].KV.ModRevision {
			t.Fatal("events out of revision order")
		}
	}
	// Then live.
	put(t, s, "w/c", "3")
	if e := collect(t, w, 1)[0]; e.KV.Key != "w/c" {
		t.Fatalf("live event %+v", e)
	}
}

func testWatchLive(t *testing.T, s store.Store) {
	put(t, s, "before", "x")
	w := s.Watch(ctx(t), "live/", 0)
	// Many writers; the watcher must see every revision exactly once, in
	// order.
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			put(t, s, fmt.Sprintf("live/%03d", i), "v")
			put(t, s, fmt.Sprintf("dead/%03d", i), "v")
		}()
	}
	wg.Wait()
	evs := collect(t, w, n)
	seen := map[string]bool{}
	for i, e := range evs {
		if seen[e.KV.Key] {
			t.Fatalf("event for %s twice", e.KV.Key)
		}
		seen[e.KV.Key] = true
		if i > 0 && e.KV.ModRevision <= evs[i-1].KV.ModRevision {
			t.Fatal("events out of order")
		}
	}
}

func testCompaction(t *testing.T, s store.Store) {
	r1 := put(t, s, "c/a", "1")
	r2 := put(t, s, "c/a", "2")
	r3 := put(t, s, "c/a", "3")
	if err := s.Compact(ctx(t), r3+10); !errors.Is(err, store.ErrFuture) {
		t.Fatalf("compact past the current revision: %v", err)
	}
	if err := s.Compact(ctx(t), r2); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx(t), r1); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("compact to an older revision: %v", err)
	}
	select {
	case r := <-s.Watch(ctx(t), "c/", r1):
		if !errors.Is(r.Err, store.ErrCompacted) {
			t.Fatalf("watch from a compacted revision: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch from a compacted revision said nothing")
	}
	evs := collect(t, s.Watch(ctx(t), "c/", r2), 2)
	if evs[0].KV.ModRevision != r2 || string(evs[1].KV.Value) != "3" {
		t.Fatalf("history after compaction: %+v", evs)
	}
	if kv, _ := s.Get(ctx(t), "c/a"); string(kv.Value) != "3" {
		t.Fatal("compaction changed the current value")
	}
}

func testConcurrentCAS(t *testing.T, s store.Store) {
	put(t, s, "counter", "0")
	const workers, each = 8, 25
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				for {
					kv, err := s.Get(ctx(t), "counter")
					if err != nil {
						t.Error(err)
						return
					}
					var n int
					fmt.Sscan(string(kv.Value), &n)
					res, err := store.CAS(ctx(t), s, "counter", kv.ModRevision, []byte(fmt.Sprint(n+1)))
					if err != nil {
						t.Error(err)
						return
					}
					if res.Succeeded {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	kv, _ := s.Get(ctx(t), "counter")
	if string(kv.Value) != fmt.Sprint(workers*each) {
		t.Fatalf("counter %s after %d increments: an update was lost", kv.Value, workers*each)
	}
}

func testEmptyKey(t *testing.T, s store.Store) {
	if _, err := store.Put(ctx(t), s, "", []byte("x")); !errors.Is(err, store.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
}
