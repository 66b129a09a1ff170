package db

import (
	"strings"
	"testing"

	"github.com/edgebox/edgebox/internal/boltdb"
)

func TestNewerSchemaRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bdb, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	boltdb.SetSchema(bdb, 99)
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
