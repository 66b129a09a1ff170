// Package audit is the console's append-only log of every change: each
// mutating API call and every enrollment, approval and revocation, with who,
// what, when and from where.
package audit

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/db"
)

// Entry is one audited event.
type Entry struct {
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

// Log appends to and reads the audit bucket.
type Log struct {
	db  *bolt.DB
	now func() time.Time
}

// New returns a Log on an opened database.
func New(bdb *bolt.DB) *Log { return &Log{db: bdb, now: time.Now} }

// Append records e, filling in Seq and Time.
func (l *Log) Append(e Entry) error {
	return l.db.Update(func(tx *bolt.Tx) error { return AppendTx(tx, l.now(), e) })
}

// AppendTx records e inside a caller's transaction, so a change and its
// audit entry commit together.
func AppendTx(tx *bolt.Tx, now time.Time, e Entry) error {
	b := tx.Bucket(db.Audit)
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	e.Seq, e.Time = seq, now.UTC()
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return b.Put(binary.BigEndian.AppendUint64(nil, seq), v)
}

// Query selects entries.
type Query struct {
	TenantID string
	After    uint64 // only entries with Seq > After
	Limit    int    // at most this many, newest first when After is 0
	Target   string // only entries about this target
}

// List returns entries matching q: the newest Limit ones, oldest first.
func (l *Log) List(q Query) ([]Entry, error) {
	if q.Limit <= 0 || q.Limit > 1000 {
		q.Limit = 100
	}
	var out []Entry
	err := l.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(db.Audit).Cursor()
		for k, v := c.Last(); k != nil && len(out) < q.Limit; k, v = c.Prev() {
			if binary.BigEndian.Uint64(k) <= q.After {
				break
			}
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("audit: entry %x: %w", k, err)
			}
			if (q.TenantID != "" && e.TenantID != q.TenantID) || (q.Target != "" && e.Target != q.Target) {
				continue
			}
			out = append(out, e)
		}
		return nil
	})
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, err
}
