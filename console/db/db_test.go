package db

import (
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestNewerSchemaRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bdb, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	bdb.Update(func(tx *bolt.Tx) error { return tx.Bucket(Meta).Put(schemaKey, []byte("99")) })
	bdb.Close()
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "upgrade the console") {
		t.Fatalf("got %v, want a refusal naming the upgrade", err)
	}
}

func TestOpenTwiceSaysInUse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bdb, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "in use by another console") {
		t.Fatalf("got %v", err)
	}
}
