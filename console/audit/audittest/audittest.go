// Package audittest checks that a domain operation leaves its audit entry:
// one per change, written in the change's own transaction.
package audittest

import (
	"context"
	"errors"
	"maps"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
)

// ErrAuditWrite is what a store made by Failing returns for a transaction
// that writes an audit entry while failing is on.
var ErrAuditWrite = errors.New("audittest: the audit entry could not be written")

// Store wraps a real store. While Fail is on, every transaction that would
// write an audit entry fails as a whole, as a full disk or a lost etcd
// quorum would fail it; nothing of it is applied.
type Store struct {
	store.Store
	fail atomic.Bool
}

// Wrap returns s wrapped.
func Wrap(s store.Store) *Store { return &Store{Store: s} }

// Fail turns failing audit writes on or off.
func (s *Store) Fail(on bool) { s.fail.Store(on) }

// Txn applies t, unless it writes an audit entry while failing is on.
func (s *Store) Txn(ctx context.Context, t store.Txn) (store.TxnResult, error) {
	if s.fail.Load() {
		for _, op := range t.Then {
			if strings.HasPrefix(op.Key, audit.Prefix) {
				return store.TxnResult{}, ErrAuditWrite
			}
		}
	}
	return s.Store.Txn(ctx, t)
}

// Entries returns every audit entry of every tenant on s, oldest first.
func Entries(t testing.TB, s store.Store) []audit.Entry {
	t.Helper()
	kvs, _, err := s.Range(context.Background(), audit.Prefix, 0)
	if err != nil {
		t.Fatal(err)
	}
	var tenants []string
	seen := map[string]bool{}
	for _, kv := range kvs {
		tenant, _, _ := strings.Cut(strings.TrimPrefix(kv.Key, audit.Prefix), "/")
		if !seen[tenant] {
			seen[tenant] = true
			tenants = append(tenants, tenant)
		}
	}
	var out []audit.Entry
	for _, tenant := range tenants {
		es, err := audit.New(s, nil).List(context.Background(), audit.Query{TenantID: tenant, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, es...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// One runs op and checks that it left exactly one new audit entry with
// action; it returns the entry. With the store failing audit writes, op must
// fail, leave no entry and change nothing else on the store: a change never
// lands without its entry.
func One(t testing.TB, s *Store, action string, op func() error) audit.Entry {
	t.Helper()
	before := len(Entries(t, s))
	keys := revisions(t, s)
	s.Fail(true)
	err := op()
	s.Fail(false)
	if !errors.Is(err, ErrAuditWrite) {
		t.Fatalf("%s with the audit write failing: err %v, want the audit write's error", action, err)
	}
	if n := len(Entries(t, s)); n != before {
		t.Fatalf("%s with the audit write failing left %d entries", action, n-before)
	}
	if after := revisions(t, s); !maps.Equal(after, keys) {
		t.Fatalf("%s with the audit write failing changed the store: %d keys before, %d after", action, len(keys), len(after))
	}
	if err := op(); err != nil {
		t.Fatalf("%s: %v", action, err)
	}
	es := Entries(t, s)
	if len(es) != before+1 {
		t.Fatalf("%s left %d audit entries, want 1: %+v", action, len(es)-before, es[before:])
	}
	e := es[len(es)-1]
	if e.Action != action || e.Result != "ok" {
		t.Fatalf("%s left entry %+v", action, e)
	}
	return e
}

// revisions maps every key on s but the audit log's to its ModRevision.
func revisions(t testing.TB, s store.Store) map[string]int64 {
	t.Helper()
	kvs, _, err := s.Range(context.Background(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64, len(kvs))
	for _, kv := range kvs {
		if !strings.HasPrefix(kv.Key, audit.Prefix) {
			out[kv.Key] = kv.ModRevision
		}
	}
	return out
}
