package store_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
)

func TestMemoOnBolt(t *testing.T) {
	testMemo(t, func(t *testing.T) store.Store { return storetest.Bolt(t) })
}

func TestMemoOnEtcd(t *testing.T) { testMemo(t, newEtcd) }

// testMemo: a value is loaded once and kept; a change under the root,
// from this process or another, makes the next Get load again; a change
// while a value loads keeps it from being kept; nothing is kept while
// the watch is not running; a Get's error is returned and nothing kept.
func testMemo(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := store.NewMemo[string](s, "cat/", 2, log)
	var loads atomic.Int32
	load := func(ctx context.Context) (string, error) {
		loads.Add(1)
		kv, err := s.Get(ctx, "cat/t1/x")
		return string(kv.Value), err
	}
	get := func() string {
		t.Helper()
		v, err := m.Get(ctx, "t1", load)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if _, err := store.Put(ctx, s, "cat/t1/x", []byte("v1")); err != nil {
		t.Fatal(err)
	}

	// Not running: every Get loads.
	get()
	get()
	if n := loads.Load(); n != 2 {
		t.Fatalf("before Run: %d loads for two Gets, want 2", n)
	}

	storetest.Run(t, m.Run)
	// Kept, once the watch is live: two Gets, at most one load.
	kept := func() bool {
		loads.Store(0)
		get()
		get()
		return loads.Load() <= 1
	}
	waitFor(t, 10*time.Second, kept)

	// A write elsewhere under the root: seen through the watch.
	if _, err := store.Put(ctx, s, "cat/t1/x", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return get() == "v2" })
	waitFor(t, 10*time.Second, kept)

	// A write outside the root changes nothing.
	loads.Store(0)
	if _, err := store.Put(ctx, s, "other/y", []byte("1")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	get()
	if n := loads.Load(); n != 0 {
		t.Fatalf("after a write outside the root: %d loads, want 0", n)
	}

	// This process's own write: seen at once after Forget.
	if _, err := store.Put(ctx, s, "cat/t1/x", []byte("v3")); err != nil {
		t.Fatal(err)
	}
	m.Forget()
	if v := get(); v != "v3" {
		t.Fatalf("after a write and Forget: %q, want v3", v)
	}

	// A change while a value loads: returned, but not kept.
	waitFor(t, 10*time.Second, kept)
	m.Forget()
	v, err := m.Get(ctx, "t1", func(ctx context.Context) (string, error) {
		v, err := load(ctx)
		m.Forget() // as a write of another would, between the read and the keeping
		return v, err
	})
	if err != nil || v != "v3" {
		t.Fatalf("Get = %q, %v; want v3", v, err)
	}
	loads.Store(0)
	get()
	if n := loads.Load(); n != 1 {
		t.Fatalf("a value changed while it loaded was kept: %d loads, want 1", n)
	}

	// An error is returned and nothing kept.
	m.Forget()
	if _, err := m.Get(ctx, "t2", func(context.Context) (string, error) { return "", store.ErrNotFound }); err != store.ErrNotFound {
		t.Fatalf("Get of a failing load: %v, want ErrNotFound", err)
	}
	var tries atomic.Int32
	m.Get(ctx, "t2", func(context.Context) (string, error) { tries.Add(1); return "ok", nil })
	if tries.Load() != 1 {
		t.Fatal("a failed load was kept")
	}

	// At most max values.
	m.Forget()
	for _, k := range []string{"a", "b", "c"} {
		m.Get(ctx, k, func(context.Context) (string, error) { return k, nil })
	}
	tries.Store(0)
	m.Get(ctx, "c", func(context.Context) (string, error) { tries.Add(1); return "c", nil })
	if tries.Load() != 1 {
		t.Fatal("a third value was kept in a memo of two")
	}
}
