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
