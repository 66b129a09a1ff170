// Package db opens the console's bbolt database and keeps its schema.
//
// The console's records live on its store (console/store), whose bbolt
// implementation keeps its own buckets (store_meta, store_kv, store_log) in
// this same file. What is left to this package's layout (schema version 2):
//
//	meta/
//	    schema                  -> decimal schema version
//	tenants/<tenant id>         -> (reserved for tenant records; every record
//	                               already names its tenant)
//
// Schema 1 also kept, until MoveToStore takes them onto the store at the
// first start of a schema-2 console and deletes them:
//
//	boxes/<box id>              -> fleet.Box (JSON)         -> fleet/boxes/<box id>
//	tokens/<token id, hex>      -> fleet.EnrollToken (JSON) -> fleet/tokens/<token id>
//	apitokens/<sha256 hex>      -> auth.APIToken (JSON)     -> auth/tokens/<sha256 hex>
//	audit/<u64 big-endian seq>  -> audit.Entry (JSON)       -> audit/<tenant>/… (audit.ImportOp)
//
// Schema 2 changes no bucket itself: it tells a console of schema 1, which
// would find its buckets gone, to refuse the database.
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
	// Schema 2: boxes, tokens, apitokens and audit move onto the store
	// (MoveToStore, which needs the store, so runs after Open).
	1: func(*bolt.Tx) error { return nil },
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
