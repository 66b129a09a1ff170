package pki

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTicketKeysRotateAndPersist follows the keys over days: one key made
// and kept across reopening, a new one first after TicketKeyRotation, old
// ones dropped after TicketKeyLifetime, and a damaged file replaced.
func TestTicketKeysRotateAndPersist(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, _, err := Open(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	day0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	first, err := a.TicketKeys(day0)
	if err != nil || len(first) != 1 {
		t.Fatalf("first keys: %d, %v", len(first), err)
	}
	path := filepath.Join(dir, ticketKeysFile)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want mode 0600", fi.Mode(), err)
	}
	// A restart the same day: the same key, as a reopened authority reads it.
	b, _, err := Open(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.TicketKeys(day0.Add(23 * time.Hour))
	if err != nil || len(again) != 1 || again[0] != first[0] {
		t.Fatalf("keys a restart later: %d, %v", len(again), err)
	}
	// A day on: a new key encrypts, the old one still decrypts.
	next, err := b.TicketKeys(day0.Add(25 * time.Hour))
	if err != nil || len(next) != 2 || next[1] != first[0] || next[0] == first[0] {
		t.Fatalf("keys a day later: %d, %v", len(next), err)
	}
	// Eight days on, daily: never more than a week of keys.
	var keys [][32]byte
	for d := 2; d <= 10; d++ {
		if keys, err = b.TicketKeys(day0.Add(time.Duration(d)*24*time.Hour + time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if len(keys) != 8 || keys[len(keys)-1] == first[0] || keys[len(keys)-1] == next[0] {
		t.Fatalf("%d keys after ten days, the first still among them: want the last week's 8", len(keys))
	}
	// A damaged file starts afresh rather than stopping the console.
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	fresh, err := b.TicketKeys(day0.Add(11 * 24 * time.Hour))
	if err != nil || len(fresh) != 1 {
		t.Fatalf("after a damaged file: %d keys, %v", len(fresh), err)
	}
}
