package store_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
)

func TestBolt(t *testing.T) {
	storetest.Suite(t, func(t *testing.T) store.Store { return storetest.Bolt(t) })
}

func TestBoltSurvivesReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "store.db")
	open := func() (*bolt.DB, *store.Bolt) {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.OpenBolt(db)
		if err != nil {
			t.Fatal(err)
		}
		return db, s
	}
	ctx := context.Background()
	db, s := open()
	r1, _ := store.Put(ctx, s, "k", []byte("1"))
	r2, _ := store.Put(ctx, s, "k", []byte("2"))
	s.Close()
	if _, err := store.Put(ctx, s, "k", []byte("3")); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("put after Close: %v", err)
	}
	db.Close()

	db, s = open()
	defer db.Close()
	defer s.Close()
	if rev, _ := s.Revision(ctx); rev != r2 {
		t.Fatalf("revision after reopen %d, want %d", rev, r2)
	}
	w := s.Watch(ctx, "", r1)
	r := <-w
	if r.Err != nil || len(r.Events) != 2 || string(r.Events[1].KV.Value) != "2" {
		t.Fatalf("history after reopen: %+v", r)
	}
	if r3, _ := store.Put(ctx, s, "k", []byte("3")); r3 != r2+1 {
		t.Fatalf("next revision %d, want %d", r3, r2+1)
	}
}

// TestBoltWatchWhileClosing opens watches while the store closes: each
// either runs until the close ends it or is refused with ErrClosed, and
// Close waits for every one (the race detector checks the order).
func TestBoltWatchWhileClosing(t *testing.T) {
	t.Parallel()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "store.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := store.OpenBolt(db)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	watches := make(chan (<-chan store.WatchResponse), 200)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			watches <- s.Watch(ctx, "k/", 1)
		}
	}()
	s.Close()
	<-done
	close(watches)
	refused := 0
	for w := range watches {
		for r := range w { // every channel closes
			if r.Err != nil && !errors.Is(r.Err, store.ErrClosed) {
				t.Fatalf("watch during close: %v", r.Err)
			}
			if errors.Is(r.Err, store.ErrClosed) {
				refused++
			}
		}
	}
	if w := s.Watch(ctx, "k/", 1); !errors.Is((<-w).Err, store.ErrClosed) {
		t.Fatal("a watch on a closed store was not refused with ErrClosed")
	}
	t.Logf("%d of 200 watches refused", refused)
}
