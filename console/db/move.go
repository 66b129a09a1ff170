package db

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
)

// moveChunk is how many records one store transaction moves: with a box's
// revocation key, at most 100 writes and 50 guards, below etcd's default
// limit of 128 of each.
const moveChunk = 50

// A move takes one bucket's records onto the store: ops returns the writes
// of one record, the first of them its own key.
type move struct {
	bucket []byte
	ops    func(k, v []byte) ([]store.Op, error)
}

var moves = []move{
	{Boxes, func(k, v []byte) ([]store.Op, error) {
		var b fleet.Box
		if err := json.Unmarshal(v, &b); err != nil {
			return nil, err
		}
		ops := []store.Op{{Key: fleet.BoxKey(string(k)), Value: v}}
		if b.State == fleet.StateRevoked {
			ops = append(ops, store.Op{Key: fleet.RevokedKey(string(k)), Value: []byte(b.TenantID)})
		}
		return ops, nil
	}},
	{Tokens, func(k, v []byte) ([]store.Op, error) {
		return []store.Op{{Key: fleet.TokenKey(string(k)), Value: v}}, nil
	}},
	{APITokens, func(k, v []byte) ([]store.Op, error) {
		return []store.Op{{Key: auth.Key(string(k)), Value: v}}, nil
	}},
	{Audit, func(k, v []byte) ([]store.Op, error) {
		var e audit.Entry
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, err
		}
		if len(k) == 8 {
			e.Seq = binary.BigEndian.Uint64(k)
		}
		return []store.Op{audit.ImportOp(e)}, nil
	}},
}

// MoveToStore moves what consoles before schema 2 kept in the boxes,
// tokens, apitokens and audit buckets onto st, then deletes each bucket
// once all its records are on st. It runs at every start, before anything
// reads the store; with nothing left to move it only looks.
//
// A record is written only if its key is not on st yet, so a record
// already moved, and changed since, is never overwritten; audit entries
// get keys of their own sequence number (audit.ImportOp). So a move cut
// short at any point (a kill, a full disk) leaves a state the next start
// goes on from, and nothing is lost or doubled.
func MoveToStore(ctx context.Context, bdb *bolt.DB, st store.Store) error {
	for _, m := range moves {
		if err := m.run(ctx, bdb, st); err != nil {
			return fmt.Errorf("db: moving %s onto the store: %w", m.bucket, err)
		}
	}
	return nil
}

func (m move) run(ctx context.Context, bdb *bolt.DB, st store.Store) error {
	var after []byte
	for {
		var recs [][]store.Op
		err := bdb.View(func(tx *bolt.Tx) error {
			b := tx.Bucket(m.bucket)
			if b == nil {
				return nil
			}
			c := b.Cursor()
			k, v := c.First()
			if after != nil {
				if k, v = c.Seek(after); k != nil && string(k) == string(after) {
					k, v = c.Next()
				}
			}
			for ; k != nil && len(recs) < moveChunk; k, v = c.Next() {
				ops, err := m.ops(k, v)
				if err != nil {
					return fmt.Errorf("record %x: %w", k, err)
				}
				recs = append(recs, ops)
				after = append(after[:0], k...)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			break
		}
		if err := create(ctx, st, recs); err != nil {
			return err
		}
	}
	err := bdb.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(m.bucket); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
			return err
		}
		return nil
	})
	return err
}

// create writes, in one transaction, each record whose key is not on st.
func create(ctx context.Context, st store.Store, recs [][]store.Op) error {
	for range 10 {
		var t store.Txn
		for _, ops := range recs {
			if _, err := st.Get(ctx, ops[0].Key); err == nil {
				continue // moved already, maybe changed since
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
			t.If = append(t.If, store.Cmp{Key: ops[0].Key})
			t.Then = append(t.Then, ops...)
		}
		if len(t.Then) == 0 {
			return nil
		}
		res, err := st.Txn(ctx, t)
		if err != nil {
			return err
		}
		if res.Succeeded {
			return nil
		}
	}
	return errors.New("the records kept being created by another console meanwhile")
}
