// Package boltdb opens bbolt files that carry a schema version and brings
// them up to date with migrations; the console's and the agent's stores
// both open their files through it.
package boltdb

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	metaBucket = []byte("meta")
	schemaKey  = []byte("schema")
)

// Migration moves a database from one schema version to the next.
type Migration func(tx *bolt.Tx) error

// Open opens (creating) path, mode 0600, and runs migrations[v:] where v is
// the stored schema version, recording len(migrations) as the new one, all
// in one transaction. The schema lives in the "meta" bucket. A file with a
// newer schema than len(migrations) is refused; owner names the program for
// the messages ("console", "agent").
func Open(path string, migrations []Migration, owner string) (*bolt.DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("%s is in use by another %s", path, owner)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	want := len(migrations)
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		v, _ := strconv.Atoi(string(meta.Get(schemaKey)))
		if v > want {
			return fmt.Errorf("%s has schema %d, newer than this %s's %d; upgrade the %s", path, v, owner, want, owner)
		}
		for ; v < want; v++ {
			if err := migrations[v](tx); err != nil {
				return fmt.Errorf("%s: migrating to schema %d: %w", path, v+1, err)
			}
		}
		return meta.Put(schemaKey, []byte(strconv.Itoa(want)))
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// Check runs bbolt's consistency check and returns its first finding.
func Check(db *bolt.DB) error {
	return db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
}

// SetSchema overwrites the stored schema version; tests use it to fake a
// file from a newer program.
func SetSchema(db *bolt.DB, v int) error {
	return db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(metaBucket).Put(schemaKey, []byte(strconv.Itoa(v)))
	})
}
