package storetest

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/store"
)

// Bolt returns a bbolt store in a file of the test's own, closed at the
// end of the test.
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
	t.Cleanup(func() { s.Close(); db.Close() })
	return s
}
