// Package audit is the console's append-only log of every change: each
// mutating API call and every enrollment, approval and revocation, with who,
// what, when and from where.
//
// Entries live on the console's store, under
//
//	audit/<tenant>/<19 digits: max int64 - unix nanoseconds>-<16 hex>
//
// so a tenant's newest entries come first in key order. A change writes
// its entry in its own store transaction (Op), so the change and its entry
// commit together or not at all.
package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/edgebox/edgebox/console/store"
)

// Prefix is where entries live on the store.
const Prefix = "audit/"

// Actor says who asks for a change and from where.
type Actor struct {
	TenantID string
	Name     string // "admin", "token:<name>", "box:<id>", "deploy", …
	Remote   string // client address, if any
}

// Did returns the entry of a change the actor made: action on target,
// succeeded, with detail.
func (a Actor) Did(action, target, detail string) Entry {
	return Entry{TenantID: a.TenantID, Actor: a.Name, Remote: a.Remote, Action: action, Target: target,
		Result: "ok", Detail: detail}
}

// Entry is one audited event.
type Entry struct {
	// Seq orders entries: the store revision that wrote the entry. It is
	// not stored; List fills it in.
	Seq      uint64    `json:"seq"`
	Time     time.Time `json:"time"`
	TenantID string    `json:"tenant_id"`
	Actor    string    `json:"actor"`  // "admin", "token:<name>", "box:<id>"
	Action   string    `json:"action"` // "token.create", "box.revoke", "box.enroll", …
	Target   string    `json:"target,omitempty"`
	Remote   string    `json:"remote,omitempty"` // client address
	Result   string    `json:"result"`           // "ok" or the error shown to the caller
	Detail   string    `json:"detail,omitempty"`
}

// Op returns the store write that records e, made at the time at: put it
// in the same transaction as the change it describes.
func Op(at time.Time, e Entry) store.Op {
	var id [8]byte
	rand.Read(id[:])
	e.Time = at.UTC()
	return op(e, hex.EncodeToString(id[:]))
}

// ImportOp returns the write of an entry from an older console, whose Seq
// and Time are set: the same entry always gets the same key, so importing
// it twice writes it once.
func ImportOp(e Entry) store.Op {
	return op(e, fmt.Sprintf("i%015x", e.Seq))
}

func op(e Entry, id string) store.Op {
	if e.TenantID == "" || strings.Contains(e.TenantID, "/") {
		// A tenant ID is validated where tenants are made; this keeps a
		// bad one from spilling into another tenant's keys.
		e.TenantID = "invalid"
	}
	e.Seq = 0
	raw, err := json.Marshal(e)
	if err != nil {
		panic(err) // strings and a time only
	}
	return store.Op{Key: fmt.Sprintf("%s%s/%019d-%s", Prefix, e.TenantID, math.MaxInt64-e.Time.UnixNano(), id), Value: raw}
}

// Log appends entries of their own and reads the log.
type Log struct {
	s   store.Store
	now func() time.Time
}

// New returns a Log on the console's store; now nil is time.Now.
func New(s store.Store, now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{s: s, now: now}
}

// Append records e on its own: for an event that changes nothing else
// (a refused call, a push to the registry).
func (l *Log) Append(ctx context.Context, e Entry) error {
	if _, err := l.s.Txn(ctx, store.Txn{Then: []store.Op{Op(l.now(), e)}}); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

// Query selects entries of one tenant.
type Query struct {
	TenantID string
	After    uint64 // only entries with Seq > After
	Limit    int    // at most this many, the newest
	Target   string // only entries about this target
	Actor    string // only entries of this actor
	Action   string // only entries whose action starts with this
	// Since and Until, when set, bound the entries' times: Since <= Time
	// < Until.
	Since, Until time.Time
}

// maxScan bounds the entries one List reads, however few match: a
// filter that matches nothing in a long log still answers in time, with
// what it found.
const maxScan = 200_000

// List returns the newest entries matching q, oldest first.
func (l *Log) List(ctx context.Context, q Query) ([]Entry, error) {
	if q.Limit <= 0 || q.Limit > 1000 {
		q.Limit = 100
	}
	if q.TenantID == "" || strings.Contains(q.TenantID, "/") {
		return nil, fmt.Errorf("audit: list: tenant %q", q.TenantID)
	}
	prefix := Prefix + q.TenantID + "/"
	var out []Entry
	after := ""
	scanned := 0
	for len(out) < q.Limit && scanned < maxScan {
		kvs, _, err := l.s.Scan(ctx, prefix, after, 256)
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		for _, kv := range kvs {
			var e Entry
			if err := json.Unmarshal(kv.Value, &e); err != nil {
				return nil, fmt.Errorf("audit: entry %s: %w", kv.Key, err)
			}
			scanned++
			e.Seq = uint64(kv.CreateRevision)
			if e.Seq <= q.After || (!q.Since.IsZero() && e.Time.Before(q.Since)) {
				kvs = nil // older than asked for: done
				break
			}
			if (q.Target != "" && e.Target != q.Target) || (q.Actor != "" && e.Actor != q.Actor) ||
				!strings.HasPrefix(e.Action, q.Action) || (!q.Until.IsZero() && !e.Time.Before(q.Until)) {
				continue
			}
			if out = append(out, e); len(out) == q.Limit {
				break
			}
		}
		if len(kvs) < 256 {
			break
		}
		after = kvs[len(kvs)-1].Key
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
