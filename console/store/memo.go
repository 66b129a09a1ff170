package store

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Memo keeps values computed from the store, each until a change under
// the root it watches: a tenant's app catalogue, read at every box's
// hello, is then read once and again only when it changes, however many
// boxes say hello. One watch of root serves every value.
//
// A value is kept only while the watch runs and nothing under root
// changed while it was computed, so a kept value is never older than the
// watch's news: on another replica a change is seen as soon as the
// watch delivers it (milliseconds), and this process's own writes are
// seen at once when the writer calls Forget after committing.
type Memo[T any] struct {
	s    Store
	root string
	max  int
	log  *slog.Logger

	mu      sync.Mutex
	live    bool   // the watch runs: changes are seen
	changes uint64 // bumped at every change seen, Forget and watch restart
	vals    map[string]T
}

// NewMemo returns a memo of values computed from keys under root,
// keeping at most max of them; Run keeps it live.
func NewMemo[T any](s Store, root string, max int, log *slog.Logger) *Memo[T] {
	return &Memo[T]{s: s, root: root, max: max, log: log, vals: map[string]T{}}
}

// Get returns the value kept for key, or computes it with load and keeps
// it. load reads the store under root; an error is returned as it is and
// nothing is kept.
func (m *Memo[T]) Get(ctx context.Context, key string, load func(context.Context) (T, error)) (T, error) {
	m.mu.Lock()
	if v, ok := m.vals[key]; ok {
		m.mu.Unlock()
		return v, nil
	}
	live, seen := m.live, m.changes
	m.mu.Unlock()
	v, err := load(ctx)
	if err != nil || !live {
		return v, err
	}
	m.mu.Lock()
	if m.live && m.changes == seen && len(m.vals) < m.max {
		m.vals[key] = v
	}
	m.mu.Unlock()
	return v, nil
}

// Forget drops every kept value: a writer calls it once its change under
// root is committed, so this process reads its own writes at once.
func (m *Memo[T]) Forget() {
	m.mu.Lock()
	m.changes++
	clear(m.vals)
	m.mu.Unlock()
}

// Run watches root until ctx ends, dropping the kept values at every
// change. While the watch is down (the store unreachable, its history
// compacted past it), nothing is kept and every Get loads.
func (m *Memo[T]) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		rev, err := m.s.Revision(ctx)
		if err == nil {
			wctx, cancel := context.WithCancel(ctx)
			watch := m.s.Watch(wctx, m.root, rev+1)
			m.setLive(true)
			err = m.follow(watch)
			m.setLive(false)
			cancel()
		}
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			m.log.Warn("store watch ended; values are read anew until it is back", "root", m.root, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// follow drops the kept values at every change from watch, until it ends.
func (m *Memo[T]) follow(watch <-chan WatchResponse) error {
	for resp := range watch {
		if resp.Err != nil {
			return resp.Err
		}
		m.Forget()
	}
	return nil
}

func (m *Memo[T]) setLive(live bool) {
	m.mu.Lock()
	m.live = live
	m.changes++
	clear(m.vals)
	m.mu.Unlock()
}
