// Package store is the console's etcd-shaped key-value store: every change
// gets a revision from one counter that only grows, writes are transactions
// guarded by compare-on-revision, and Watch replays history from any
// revision not yet compacted and then follows live changes, never missing
// one. Two implementations share one contract (storetest.Suite): bbolt, the
// default, in one file of the console's data directory; and etcd, for
// consoles that share state.
package store

import (
	"context"
	"errors"
)

// KV is a key's current value and its revisions.
type KV struct {
	Key   string
	Value []byte
	// CreateRevision is the revision that created the key, ModRevision the
	// one that last changed it; Version counts changes since creation.
	CreateRevision int64
	ModRevision    int64
	Version        int64
}

// EventType says whether an event wrote or deleted a key.
type EventType int

const (
	EventPut EventType = iota + 1
	EventDelete
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	}
	return "unknown"
}

// Event is one change. For a delete, KV has the key and ModRevision the
// deleting revision, no value.
type Event struct {
	Type EventType
	KV   KV
}

// Cmp is a transaction guard: the key's ModRevision must equal ModRevision;
// 0 means the key must not exist.
type Cmp struct {
	Key         string
	ModRevision int64
}

// Op is one write of a transaction: Put when Delete is false.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
}

// Txn is applied atomically: if every guard holds, every op is applied
// under one new revision.
type Txn struct {
	If   []Cmp
	Then []Op
}

// TxnResult says whether the guards held and, if so, the new revision.
// When they did not, Revision is the store's current revision.
type TxnResult struct {
	Succeeded bool
	Revision  int64
}

// WatchResponse carries events of one or more revisions, in revision order,
// or the error that ended the watch.
type WatchResponse struct {
	Events []Event
	Err    error
}

// Errors returned by stores.
var (
	ErrNotFound  = errors.New("store: key not found")
	ErrCompacted = errors.New("store: revision compacted")
	ErrFuture    = errors.New("store: revision not reached yet")
	ErrEmptyKey  = errors.New("store: empty key")
	ErrClosed    = errors.New("store: closed")
)

// Store is the contract. All methods are safe for concurrent use.
type Store interface {
	// Get returns a key's current value, or ErrNotFound.
	Get(ctx context.Context, key string) (KV, error)
	// Range returns the keys with prefix, in key order, at most limit of
	// them (0: all), and the store's revision at the time.
	Range(ctx context.Context, prefix string, limit int) ([]KV, int64, error)
	// Scan is Range from the first key after after: it pages through a
	// prefix, each page starting after the last key of the one before.
	// An after below prefix starts at the prefix's first key.
	Scan(ctx context.Context, prefix, after string, limit int) ([]KV, int64, error)
	// Txn applies t atomically. A transaction without ops whose guards
	// hold succeeds without a new revision.
	Txn(ctx context.Context, t Txn) (TxnResult, error)
	// Watch sends every change under prefix from revision from on: first
	// the history still kept, then live changes, each revision whole and in
	// order. from 0 means "from the next change". The channel closes when
	// ctx ends or after a response with Err (ErrCompacted when from is below
	// the compacted revision).
	Watch(ctx context.Context, prefix string, from int64) <-chan WatchResponse
	// Compact forgets history before rev; Watch from an earlier revision
	// fails with ErrCompacted. Compacting past the current revision is
	// ErrFuture.
	Compact(ctx context.Context, rev int64) error
	// Revision returns the current revision.
	Revision(ctx context.Context) (int64, error)
	// Close releases the store; Watch channels close.
	Close() error
}

// Put writes key unconditionally and returns the new revision.
func Put(ctx context.Context, s Store, key string, value []byte) (int64, error) {
	r, err := s.Txn(ctx, Txn{Then: []Op{{Key: key, Value: value}}})
	return r.Revision, err
}

// Delete deletes key unconditionally and returns the new revision.
func Delete(ctx context.Context, s Store, key string) (int64, error) {
	r, err := s.Txn(ctx, Txn{Then: []Op{{Key: key, Delete: true}}})
	return r.Revision, err
}

// CAS writes key only if its ModRevision is still modRev (0: only if it
// does not exist).
func CAS(ctx context.Context, s Store, key string, modRev int64, value []byte) (TxnResult, error) {
	return s.Txn(ctx, Txn{If: []Cmp{{Key: key, ModRevision: modRev}}, Then: []Op{{Key: key, Value: value}}})
}
