package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
)

func TestCompactorKeepsRecentHistory(t *testing.T) {
	t.Parallel()
	st := storetest.Bolt(t)
	ctx := context.Background()
	for i := range 50 {
		if _, err := store.Put(ctx, st, fmt.Sprintf("k/%d", i%5), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	c, err := store.NewCompactor(st, time.Minute, 10, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := st.Revision(ctx)
	to, err := c.Once(ctx)
	if err != nil || to != cur-10 {
		t.Fatalf("compacted to %d (%v), want %d", to, err, cur-10)
	}
	if to, err := c.Once(ctx); err != nil || to != 0 {
		t.Fatalf("a second compaction with no new revisions: %d, %v", to, err)
	}
	w := st.Watch(ctx, "k/", 1)
	if r := <-w; !errors.Is(r.Err, store.ErrCompacted) {
		t.Fatalf("watch from before the compaction: %v", r.Err)
	}
	// A watch from within the kept history still works.
	w = st.Watch(ctx, "k/", to+1)
	if r := <-w; r.Err != nil || len(r.Events) == 0 {
		t.Fatalf("watch from the kept history: %d events, %v", len(r.Events), r.Err)
	}
	// The data itself is whole.
	kvs, _, err := st.Range(ctx, "k/", 0)
	if err != nil || len(kvs) != 5 {
		t.Fatalf("after compaction: %d keys (%v), want 5", len(kvs), err)
	}
	for _, kv := range kvs {
		if kv.ModRevision <= cur-5 {
			t.Errorf("%s at revision %d, want one of the last five", kv.Key, kv.ModRevision)
		}
	}
}

func TestNewCompactorRefusesNonPositiveSettings(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range []struct {
		every time.Duration
		keep  int64
	}{{0, 10}, {time.Minute, 0}, {-time.Second, -1}} {
		if _, err := store.NewCompactor(storetest.Bolt(t), tt.every, tt.keep, log); err == nil {
			t.Errorf("NewCompactor(every %v, keep %d) accepted", tt.every, tt.keep)
		}
	}
}
