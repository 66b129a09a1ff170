package dist

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSumsAreFixedAtOpenAndOnlyListedFilesServed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "edgebox-agent-linux-amd64"), []byte("agent"), 0o755)
	os.WriteFile(filepath.Join(dir, "secret.key"), []byte("no"), 0o600)
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, SumsFile))
	sum := sha256.Sum256([]byte("agent"))
	if want := hex.EncodeToString(sum[:]) + "  edgebox-agent-linux-amd64\n"; string(raw) != want {
		t.Fatalf("SHA256SUMS %q, want %q", raw, want)
	}
	if got := d.Files(); len(got) != 1 || got[0] != "edgebox-agent-linux-amd64" {
		t.Fatalf("files: %v", got)
	}
	for _, name := range []string{"secret.key", "../dist/secret.key", "", SumsFile + "x"} {
		if _, ok := d.Path(name); ok {
			t.Errorf("%q is served", name)
		}
	}
	if p, ok := d.Path(SumsFile); !ok || p != filepath.Join(dir, SumsFile) {
		t.Fatalf("SHA256SUMS not served: %q", p)
	}
	// A binary changed after the console started no longer matches: the
	// sums are read back, not computed again.
	os.WriteFile(filepath.Join(dir, "edgebox-agent-linux-amd64"), []byte("evil"), 0o755)
	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.sums["edgebox-agent-linux-amd64"] != d.sums["edgebox-agent-linux-amd64"] {
		t.Fatal("a second Open computed the sums again")
	}
}

func TestBadSumsFile(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"nothex  f\n", strings.Repeat("a", 64) + "  ../../etc/passwd\n", "one field\n"} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, SumsFile), []byte(bad), 0o644)
		if _, err := Open(dir); err == nil {
			t.Errorf("SHA256SUMS %q was accepted", bad)
		}
	}
	if d, err := Open(filepath.Join(t.TempDir(), "absent")); err != nil || len(d.Files()) != 0 {
		t.Fatalf("a missing directory: %v", err)
	}
}
