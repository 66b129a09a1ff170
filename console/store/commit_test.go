package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// openTestBolt opens a store on a fresh file.
func openTestBolt(t *testing.T) *Bolt {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "store.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := OpenBolt(db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestManyWritersShareCommits: writers that each write again a moment
// after their last write committed, as a returning fleet's sessions do
// (a hello, then an acknowledgement, then a status), find the committer
// waiting for them, and share commits; without the wait, each commit took
// only those that were back in time, a few.
func TestManyWritersShareCommits(t *testing.T) {
	s := openTestBolt(t)
	const writers, each = 32, 40
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				time.Sleep(2 * time.Millisecond)
				if _, err := Put(context.Background(), s, fmt.Sprintf("k/%d/%d", w, i), []byte("v")); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	s.Close()
	per := float64(writers*each) / float64(s.commits)
	t.Logf("%d transactions in %d commits (%.1f each), %d of them after a wait", writers*each, s.commits, per, s.lingered)
	if per < writers/2 {
		t.Fatalf("%.1f transactions per commit from %d writers, want at least %d", per, writers, writers/2)
	}
}

// TestALoneWriterDoesNotWait: one writer's transactions, one after
// another, are each committed at once.
func TestALoneWriterDoesNotWait(t *testing.T) {
	s := openTestBolt(t)
	for i := range 50 {
		if _, err := Put(context.Background(), s, fmt.Sprint("k/", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	if s.commits != 50 || s.lingered != 0 {
		t.Fatalf("50 transactions one after another: %d commits, %d after a wait; want 50 and 0", s.commits, s.lingered)
	}
}
