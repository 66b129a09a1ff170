package storetest

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/internal/boltdb"
)

// Bolt returns a bbolt store in a file of the test's own; at the end of
// the test it is closed and the file's consistency checked.
func Bolt(t testing.TB) store.Store {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "s.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.OpenBolt(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := boltdb.Check(db); err != nil {
			t.Errorf("bbolt check: %v", err)
		}
		db.Close()
	})
	return s
}
