package storetest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/store"
)

// Observed wraps a store for tests of what reads it: it counts the
// reads (Gets and Ranges) of keys under Prefix, and its watches bring
// each change Lag late, as a busy replica's may.
type Observed struct {
	store.Store
	Prefix string
	Lag    time.Duration

	reads atomic.Int64
}

// Reads returns the reads under Prefix since the last call.
func (o *Observed) Reads() int64 { return o.reads.Swap(0) }

func (o *Observed) Get(ctx context.Context, key string) (store.KV, error) {
	if strings.HasPrefix(key, o.Prefix) {
		o.reads.Add(1)
	}
	return o.Store.Get(ctx, key)
}

func (o *Observed) Range(ctx context.Context, prefix string, limit int) ([]store.KV, int64, error) {
	if strings.HasPrefix(prefix, o.Prefix) {
		o.reads.Add(1)
	}
	return o.Store.Range(ctx, prefix, limit)
}

func (o *Observed) Watch(ctx context.Context, prefix string, from int64) <-chan store.WatchResponse {
	in, out := o.Store.Watch(ctx, prefix, from), make(chan store.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			select {
			case <-time.After(o.Lag):
			case <-ctx.Done():
				return
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Settle calls round until one call of it reads at most max times under
// Prefix, and fails t, naming what, if none does within 10 s.
func (o *Observed) Settle(t testing.TB, max int64, what string, round func()) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		o.Reads()
		round()
		n := o.Reads()
		if n <= max {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s read the store %d times, want at most %d", what, n, max)
		}
	}
}

// Run runs run, a loop such as a watch's, until the test ends, and then
// checks that it returned nil.
func Run(t testing.TB, run func(context.Context) error) {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}
