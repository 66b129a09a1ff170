package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/internal/boltdb"
)

// openTestBolt opens a store on a fresh file, its commits waiting up to
// linger for one another, as storetest.Bolt does for other packages: at
// the end of the test it is closed and the file's consistency checked.
func openTestBolt(t *testing.T, linger time.Duration) *Bolt {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "store.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openBolt(db, linger)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := boltdb.Check(db); err != nil {
			t.Errorf("bbolt check: %v", err)
		}
		db.Close()
	})
	return s
}

// writeTogether has each of writers write each transactions, one after
// another and a moment apart, as a returning fleet's sessions do (a hello,
// then an acknowledgement, then a status), and returns the commits they
// took.
func writeTogether(t *testing.T, s *Bolt, writers, each int) int64 {
	t.Helper()
	before := s.commits.Load()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				time.Sleep(time.Millisecond)
				if _, err := Put(context.Background(), s, fmt.Sprintf("k/%d/%d", w, i), []byte("v")); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return s.commits.Load() - before
}

// TestManyWritersShareCommits: writers that each come back a moment
// after their last write committed find the committer waiting for them,
// and share fewer commits than when each commit takes only those back in
// time; once they have gone, a lone writer is soon not waited for, and
// after a quiet spell not at all.
func TestManyWritersShareCommits(t *testing.T) {
	const writers, each = 32, 80
	apart := writeTogether(t, openTestBolt(t, 0), writers, each)
	// A longer wait than the store's own, so that a machine busy with
	// other tests still brings the writers back within it.
	s := openTestBolt(t, 20*time.Millisecond)
	together := writeTogether(t, s, writers, each)
	t.Logf("%d transactions from %d writers: %d commits waiting for one another, %d not", writers*each, writers, together, apart)
	if together*4 > apart*3 {
		t.Fatalf("%d commits waiting for one another, %d not: want at least a quarter fewer", together, apart)
	}
	lingered := s.lingered.Load()
	for i := range 60 {
		if _, err := Put(context.Background(), s, fmt.Sprint("alone/", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.lingered.Load() - lingered; n > 20 {
		t.Fatalf("60 transactions one after another once the others left: %d waited for more, want at most 20", n)
	}
	// After a quiet spell, nothing waits for the writers that left.
	writeTogether(t, s, writers, each)
	time.Sleep(2 * quietSpell)
	lingered = s.lingered.Load()
	for i := range 20 {
		if _, err := Put(context.Background(), s, fmt.Sprint("later/", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.lingered.Load() - lingered; n != 0 {
		t.Fatalf("20 transactions one after another after a quiet spell: %d waited for more, want none", n)
	}
}

// TestALoneWriterDoesNotWait: one writer's transactions, one after
// another, are each committed at once.
func TestALoneWriterDoesNotWait(t *testing.T) {
	s := openTestBolt(t, linger)
	for i := range 50 {
		if _, err := Put(context.Background(), s, fmt.Sprint("k/", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if c, l := s.commits.Load(), s.lingered.Load(); c != 50 || l != 0 {
		t.Fatalf("50 transactions one after another: %d commits, %d after a wait; want 50 and 0", c, l)
	}
}
