// Package db opens the console's bbolt database and keeps its schema.
//
// Bucket layout (schema version 1):
//
//	meta/
//	    schema                  -> decimal schema version
//	tenants/<tenant id>         -> (reserved for tenant records; every record
//	                               already names its tenant)
//	boxes/<box id>              -> fleet.Box (JSON)
//	tokens/<token id, hex>      -> fleet.EnrollToken (JSON; the secret only hashed)
//	apitokens/<sha256 hex>      -> auth.APIToken (JSON)
//	audit/<u64 big-endian seq>  -> audit.Entry (JSON), append-only
//
// Each package owns its buckets; this one creates them and runs
// migrations.
package db

import (
	"fmt"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/internal/boltdb"
)

// Bucket names.
var (
	Meta      = []byte("meta")
	Tenants   = []byte("tenants")
	Boxes     = []byte("boxes")
	Tokens    = []byte("tokens")
	APITokens = []byte("apitokens")
	Audit     = []byte("audit")
)

// migrations[i] moves a database from schema i to i+1; the schema version
// is len(migrations).
var migrations = []boltdb.Migration{
	0: func(tx *bolt.Tx) error {
		for _, b := range [][]byte{Tenants, Boxes, Tokens, APITokens, Audit} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	},
}

// SchemaVersion is the layout this code reads and writes.
var SchemaVersion = len(migrations)

// Open opens (creating if needed) console.db in dir and brings its schema
// up to date. A database from a newer edgebox is refused.
func Open(dir string) (*bolt.DB, error) {
	bdb, err := boltdb.Open(filepath.Join(dir, "console.db"), migrations, "console")
	if err != nil {
		return nil, fmt.Errorf("db: %w", err)
	}
	return bdb, nil
}
