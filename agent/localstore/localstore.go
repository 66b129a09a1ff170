// Package localstore is the box's own record of its desired state, so the
// agent reconciles from disk, not from the network: after a power cut with
// the WAN down, every workload comes back as last desired.
//
// Bucket layout (schema 1), in <data dir>/agent.db:
//
//	meta/
//	    schema                -> decimal schema version
//	    revision              -> u64 the box revision of the last batch stored
//	desired/<kind>/<name>     -> edgeboxv1.DesiredObject (protobuf)
//
// A batch and its revision are written in one transaction, so after a crash
// the store holds either the whole batch or none of it, and the revision
// says which.
package localstore

import (
	"encoding/binary"
	"fmt"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/internal/boltdb"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

var (
	bucketMeta    = []byte("meta")
	bucketDesired = []byte("desired")
	keyRevision   = []byte("revision")
)

// migrations[i] moves a database from schema i to i+1; the schema version
// is len(migrations).
var migrations = []boltdb.Migration{
	0: func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketDesired)
		return err
	},
}

// Store is the box's desired-state store. It is safe for concurrent use.
type Store struct {
	db *bolt.DB
}

// Open opens (creating) agent.db in dir and migrates it.
func Open(dir string) (*Store, error) {
	db, err := boltdb.Open(filepath.Join(dir, "agent.db"), migrations, "agent")
	if err != nil {
		return nil, fmt.Errorf("localstore: %w", err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Revision is the box revision of the last batch stored; 0 for a new or
// wiped box.
func (s *Store) Revision() (uint64, error) {
	var rev uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta).Get(keyRevision); len(b) == 8 {
			rev = binary.BigEndian.Uint64(b)
		}
		return nil
	})
	return rev, err
}

func key(kind, name string) []byte { return []byte(kind + "/" + name) }

// Apply stores a batch of objects (tombstones delete) and its revision in
// one transaction. A batch at or below the stored revision was applied
// already and changes nothing, so a box that crashed between storing and
// acknowledging can be sent it again. It reports whether it wrote.
func (s *Store) Apply(objs []*edgeboxv1.DesiredObject, rev uint64) (bool, error) {
	wrote := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta, des := tx.Bucket(bucketMeta), tx.Bucket(bucketDesired)
		if b := meta.Get(keyRevision); len(b) == 8 && binary.BigEndian.Uint64(b) >= rev {
			return nil
		}
		for _, o := range objs {
			if err := edgeboxv1.CheckKey(o.GetKind(), o.GetName()); err != nil {
				return fmt.Errorf("localstore: revision %d: %w", rev, err)
			}
			k := key(o.GetKind(), o.GetName())
			if o.GetDeleted() {
				if err := des.Delete(k); err != nil {
					return err
				}
				continue
			}
			raw, err := proto.Marshal(o)
			if err != nil {
				return err
			}
			if err := des.Put(k, raw); err != nil {
				return err
			}
		}
		wrote = true
		return meta.Put(keyRevision, binary.BigEndian.AppendUint64(nil, rev))
	})
	return wrote, err
}

// Replace drops everything stored and stores objs at rev, in one
// transaction: the console's state went back (restored from a backup) and
// the box takes it whole.
func (s *Store) Replace(objs []*edgeboxv1.DesiredObject, rev uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketDesired); err != nil {
			return err
		}
		des, err := tx.CreateBucket(bucketDesired)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if err := edgeboxv1.CheckKey(o.GetKind(), o.GetName()); err != nil {
				return fmt.Errorf("localstore: reset: %w", err)
			}
			if o.GetDeleted() {
				return fmt.Errorf("localstore: reset with a tombstone")
			}
			raw, err := proto.Marshal(o)
			if err != nil {
				return err
			}
			if err := des.Put(key(o.GetKind(), o.GetName()), raw); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keyRevision, binary.BigEndian.AppendUint64(nil, rev))
	})
}

// Objects returns every stored object of kind ("" for all), in key order.
func (s *Store) Objects(kind string) ([]*edgeboxv1.DesiredObject, error) {
	var out []*edgeboxv1.DesiredObject
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketDesired).Cursor()
		prefix := []byte(kind)
		if kind != "" {
			prefix = append(prefix, '/')
		}
		for k, v := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, v = c.Next() {
			o := &edgeboxv1.DesiredObject{}
			if err := proto.Unmarshal(v, o); err != nil {
				return fmt.Errorf("localstore: %s: %w", k, err)
			}
			out = append(out, o)
		}
		return nil
	})
	return out, err
}

// Check verifies the database's consistency (bbolt's own check).
func (s *Store) Check() error { return boltdb.Check(s.db) }
