// Package db opens the console's bbolt database and keeps its schema.
//
// Bucket layout (schema version 1):
//
//	meta/
//	    schema                  -> decimal schema version
//	tenants/<tenant id>         -> fleet.Tenant (JSON)
//	boxes/<box id>              -> fleet.Box (JSON)
//	tokens/<token id, hex>      -> fleet.EnrollToken (JSON; the secret only hashed)
//	apitokens/<sha256 hex>      -> auth.APIToken (JSON)
//	audit/<u64 big-endian seq>  -> audit.Entry (JSON), append-only
//
// Each package owns its buckets; this one creates them and runs
// migrations.
package db

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
)

// SchemaVersion is the layout this code reads and writes.
const SchemaVersion = 1

// Bucket names.
var (
	Meta      = []byte("meta")
	Tenants   = []byte("tenants")
	Boxes     = []byte("boxes")
	Tokens    = []byte("tokens")
	APITokens = []byte("apitokens")
	Audit     = []byte("audit")
)

var schemaKey = []byte("schema")

// migrations[i] moves a database from version i to i+1.
var migrations = []func(tx *bolt.Tx) error{
	0: func(tx *bolt.Tx) error {
		for _, b := range [][]byte{Meta, Tenants, Boxes, Tokens, APITokens, Audit} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	},
}

// Open opens (creating if needed) the database file in dir and brings its
// schema up to date. A database from a newer edgebox is refused.
func Open(dir string) (*bolt.DB, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "console.db")
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("db: %s is in use by another console", path)
		}
		return nil, fmt.Errorf("db: open %s: %w", path, err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		v := 0
		if m := tx.Bucket(Meta); m != nil {
			if s := m.Get(schemaKey); s != nil {
				v, _ = strconv.Atoi(string(s))
			}
		}
		if v > SchemaVersion {
			return fmt.Errorf("db: %s has schema %d, newer than this console's %d; upgrade the console", path, v, SchemaVersion)
		}
		for ; v < SchemaVersion; v++ {
			if err := migrations[v](tx); err != nil {
				return fmt.Errorf("db: migrating to schema %d: %w", v+1, err)
			}
		}
		return tx.Bucket(Meta).Put(schemaKey, []byte(strconv.Itoa(SchemaVersion)))
	})
	if err != nil {
		bdb.Close()
		return nil, err
	}
	return bdb, nil
}
